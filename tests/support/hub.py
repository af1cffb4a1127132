"""A stand-in for the Hugging Face Hub's file endpoint on a local port: ``hf_hub_download`` pointed at it (through
``endpoint=`` or ``HF_ENDPOINT``) writes snapshots, refs and revisions into the cache as it does for the real Hub."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Hub:
    """A stand-in for the Hugging Face Hub's file endpoint: ``/{repo}/resolve/{revision}/{file}``."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str, str], bytes] = {}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: bool) -> None:
                hub.requests.append(self.path)
                parts = self.path.split("?")[0].strip("/").split("/")
                key = None
                if len(parts) >= 5 and parts[2] == "resolve":
                    key = ("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
                data = hub.files.get(key) if key else None
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", hashlib.sha1(f"{key[0]}@{key[1]}".encode()).hexdigest())
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(False)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put(self, repo: str, config: Path | bytes | dict, revision: str = "main") -> None:
        if isinstance(config, Path):
            data = config.read_bytes()
        elif isinstance(config, dict):
            data = json.dumps(config).encode()
        else:
            data = config
        self.files[(repo, revision, "config.json")] = data

    def download(self, repo: str, revision: str = "main") -> Path:
        """Lay out the cache with huggingface_hub itself, as a user's earlier download did."""
        from huggingface_hub import hf_hub_download

        from automodel_dist.catalog.sources import hub_cache_dir

        return Path(
            hf_hub_download(repo, "config.json", revision=revision, cache_dir=hub_cache_dir(), endpoint=self.url)
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
