"""Failures that only happen at run time (OOM, collective timeouts, ...): in the rule table so that
``explain_error`` explains them with the same lookup as the config rules."""

from __future__ import annotations

from .base import note

F = "runtime"
# Failures that only happen at run time: in the table so one lookup explains them too.
note("runtime-oom", "Out of GPU memory", family=F, severity="error",
     patterns=(r"CUDA out of memory", r"OutOfMemoryError", r"Tried to allocate [\d.]+ [GM]iB"),
     cause="Parameters, gradients, optimizer states and activations of this layout exceed the GPU's memory.",
     fix="Run `automodel-dist estimate` / `suggest`: raise dp sharding (FSDP2), add tp/pp, enable activation "
         "checkpointing, or lower the micro batch.")
note("runtime-collective-timeout", "Collective timed out", family=F, severity="error",
     patterns=(r"Watchdog caught collective operation timeout", r"NCCL.*[Tt]imeout", r"ProcessGroupNCCL.*timed out",
               r"Timed out waiting .* for (recv|send|collective)", r"gloo.*[Tt]imeout"),
     cause="One rank stopped (crashed, hung, or took a different code path) while its peers waited in a "
           "collective; the real error is usually on another rank.",
     fix="Look for the first failing rank's traceback; reproduce with `automodel-dist smoke` and a short timeout.")
note("runtime-dtensor-mesh", "FSDP and TP on different meshes", family=F, severity="error",
     patterns=(r"Expected param's DTensor mesh to be the same mesh",),
     cause="FSDP2's data-parallel mesh must be a submesh of the same root mesh TP uses.",
     fix="Use AutoModel's own meshes (get_fsdp_dp_mesh on the device_mesh); do not build a second mesh.")
note("runtime-mixed-dtensor", "Mixed Tensor and DTensor in CP attention", family=F, severity="error",
     patterns=(r"got mixed torch\.Tensor and DTensor",),
     cause="Context-parallel attention received a plain tensor beside DTensors (e.g. a mask or rotary buffer).",
     fix="Run attention under implicit_replication(), or let AutoModel's CP path strip masks (causal SDPA).")
note("runtime-moe-ac-recompute", "MoE router recomputed under activation checkpointing", family=F, severity="error",
     patterns=(r"CheckpointError", r"Recomputed values for the following tensors have different metadata"),
     cause="With activation checkpointing, recomputing the MoE router's top-k can route a different number of "
           "tokens per expert than the forward pass did.",
     fix="Keep moe.ignore_router_for_ac: true (the default) so router outputs are saved, not recomputed.")
note("runtime-mesh-rank", "Rank outside the device mesh", family=F, severity="error",
     patterns=(r"it needs to contain the local rank",),
     cause="An explicit dp_size made the mesh smaller than the world; the ranks outside cannot slice it.",
     fix="Remove dp_size (AutoModel infers it) or make dp*tp*cp*pp equal the world size.")
