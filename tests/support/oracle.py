"""The real NeMo AutoModel 0.7.0 as a test oracle (tests and bench only; never used by the engine).

``run(block, world_size, ranks)`` loads the block through AutoModel's own ``ConfigNode`` (its YAML
value semantics), calls ``recipes._dist_utils.create_distributed_setup_from_config`` under a fake
process group of ``world_size`` ranks at each requested rank, and returns its verdict, mesh shapes
and every axis group it built.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

AVAILABLE = importlib.util.find_spec("nemo_automodel") is not None


@dataclass
class OracleRank:
    ok: bool
    error: str | None = None
    groups: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class OracleResult:
    ok: bool  # accepted at every requested rank
    error: str | None  # first error text (type: message)
    device_mesh: tuple[list[str], list[int]] | None = None
    moe_mesh: tuple[list[str], list[int]] | None = None
    ranks: dict[int, OracleRank] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run(
    block: dict[str, Any] | None,
    world_size: int,
    ranks: list[int] | None = None,
    *,
    make_cfg: Callable[[], Any] | None = None,
) -> OracleResult:
    """AutoModel's verdict and meshes for ``{"distributed": block}`` at ``world_size`` (or for the
    ``ConfigNode`` that ``make_cfg`` builds afresh for each rank)."""
    import torch.distributed as dist
    from nemo_automodel.components.config.loader import ConfigNode
    from nemo_automodel.recipes._dist_utils import create_distributed_setup_from_config
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ranks = ranks if ranks is not None else [0]
    result = OracleResult(ok=True, error=None)
    capture = _Capture()
    logger = logging.getLogger("nemo_automodel")
    logger.addHandler(capture)
    propagate, logger.propagate = logger.propagate, False
    try:
        for rank in ranks:
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = make_cfg() if make_cfg else ConfigNode({"distributed": copy.deepcopy(block)})
                    setup = create_distributed_setup_from_config(cfg, world_size=world_size)
                mc = setup.mesh_context
                groups: dict[str, list[int]] = {}
                dm, mm = mc.device_mesh, mc.moe_mesh
                if dm is not None:
                    result.device_mesh = (
                        [str(n.value if hasattr(n, "value") else n) for n in dm.mesh_dim_names],
                        list(dm.mesh.shape),
                    )
                    for name in dm.mesh_dim_names:
                        groups[str(getattr(name, "value", name))] = dist.get_process_group_ranks(dm[name].get_group())
                    for name, flat in getattr(dm, "_flatten_mapping", {}).items():
                        key = str(getattr(name, "value", name))
                        if key in ("dp", "dp_shard_cp", "dp_cp"):
                            groups[key] = dist.get_process_group_ranks(flat.get_group())
                if mm is not None:
                    result.moe_mesh = ([str(getattr(n, "value", n)) for n in mm.mesh_dim_names], list(mm.mesh.shape))
                    for name in mm.mesh_dim_names:
                        groups[str(getattr(name, "value", name))] = dist.get_process_group_ranks(mm[name].get_group())
                result.ranks[rank] = OracleRank(ok=True, groups=groups)
            except Exception as exc:  # noqa: BLE001 - any failure is AutoModel's verdict
                text = f"{type(exc).__name__}: {exc}"
                result.ranks[rank] = OracleRank(ok=False, error=text)
                if result.ok:
                    result.ok, result.error = False, text
            finally:
                dist.destroy_process_group()
    finally:
        logger.removeHandler(capture)
        logger.propagate = propagate
    result.warnings = capture.messages
    return result


def load_with_overrides(path: str, argv: list[str]) -> Any:
    """AutoModel's recipe entry point: the YAML at ``path`` with the launch command's overrides applied."""
    from nemo_automodel.components.config._arg_parser import parse_args_and_load_config

    with contextlib.redirect_stdout(None):  # it prints the config path
        return parse_args_and_load_config(path, argv=argv)


@contextlib.contextmanager
def _fake_world(world_size: int) -> Iterator[_Capture]:
    """Rank 0 of a fake process group of ``world_size`` ranks, AutoModel's warnings/log lines captured."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    capture = _Capture()
    logger = logging.getLogger("nemo_automodel")
    logger.addHandler(capture)
    propagate, logger.propagate = logger.propagate, False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield capture
    finally:
        logger.removeHandler(capture)
        logger.propagate = propagate
        dist.destroy_process_group()


def _setup(block: dict[str, Any], world_size: int) -> Any:
    """AutoModel's DistributedSetup for ``{"distributed": block}`` (inside :func:`_fake_world`)."""
    from nemo_automodel.components.config.loader import ConfigNode
    from nemo_automodel.recipes._dist_utils import create_distributed_setup_from_config

    return create_distributed_setup_from_config(
        ConfigNode({"distributed": copy.deepcopy(block)}), world_size=world_size
    )


def parallelize(block: dict[str, Any], world_size: int, device: str = "meta") -> str | None:
    """AutoModel's ``parallelize_model`` on a tiny decoder (on the meta device; DDP needs ``device="cpu"``:
    it copies real tensors) after its own setup, at rank 0.

    Returns the first error text (``type: message``), or None when setup and parallelization pass.
    The module has no MoE layers, so an ep_size > 1 run fails later in expert parallelism; what this
    checks are the block-level TP rules AutoModel applies before it reaches the model's structure.
    Its MoE path imports ``transformers`` (AutoModel's own dependency, installed by scripts/setup.sh).
    """
    import torch
    from nemo_automodel.components.distributed.model_parallelizer import parallelize_model
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.o_proj = nn.Linear(8, 8), nn.Linear(8, 8)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens, self.layers = nn.Embedding(16, 8), nn.ModuleList([Block(), Block()])

    class CausalLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head = Decoder(), nn.Linear(8, 16)

    with _fake_world(world_size):
        try:
            setup = _setup(block, world_size)
            with torch.device(device):
                model = CausalLM()
            parallelize_model(model, setup.mesh_context)
        except Exception as exc:  # noqa: BLE001 - any failure is AutoModel's verdict
            return f"{type(exc).__name__}: {exc}"
    return None


def _tiny_config(model_type: str, **overrides: Any) -> Any:
    """A two-layer Hugging Face config of ``model_type`` (built on the meta device by the callers)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        model_type,
        **{
            **dict(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=128,
                vocab_size=256,
                head_dim=16,
            ),
            **overrides,
        },
    )


ATTENTION_BACKENDS = ("te", "sdpa", "flex", "magi", "eager", "torch")
# AutoModel classes whose capabilities read the model's config (the hybrid check looks for Mamba layers in it)
CONFIG_READERS = {"NemotronHForCausalLM": "nemotron_h"}
NEMOTRON_H_TINY = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    mamba_head_dim=16,
    ssm_state_size=16,
    moe_intermediate_size=32,
    vocab_size=256,
    moe_shared_expert_intermediate_size=32,
    num_experts_per_tok=2,
)


def implementation_of(architecture: str) -> tuple[str, dict[str, Any]]:
    """AutoModel's class for a Hugging Face architecture (its module) and what validate_for_mesh accepts:
    ``tp``/``pp``/``ep`` flags and ``cp_attn``, the ``backend.attn`` values that allow CP (None: any).

    AutoModel's own classes are inspected without running ``__init__`` (some need CUDA to build),
    with ``backend`` set as their ``__init__`` sets it; this checks that no such ``__init__`` assigns
    the attributes the capability code reads, so the class decides. Hugging Face classes are built
    on the meta device from a tiny config (their plans are set there).
    """
    import inspect

    import torch
    from nemo_automodel._transformers.capabilities import ModelSupports
    from nemo_automodel._transformers.registry import get_registry
    from nemo_automodel.components.models.common import BackendConfig
    from torch import nn

    registry = get_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if registry.has_custom_model(architecture):
            cls = registry.get_model_cls_from_model_arch(architecture)
            for klass in cls.__mro__:
                if klass.__module__.startswith("nemo_automodel.") and "__init__" in vars(klass):
                    source = inspect.getsource(vars(klass)["__init__"])
                    for attr in ("_tp_plan", "_pp_plan", "_supports_cp_sdpa", "_owns_cp_attention", "_supports_sdpa"):
                        assert attr not in source, (klass, attr)
                    assert "self.backend = " in source or klass is not cls, klass

            config = _tiny_config(CONFIG_READERS[architecture]) if architecture in CONFIG_READERS else None

            def instance(attn: str) -> nn.Module:
                model = cls.__new__(cls)
                nn.Module.__init__(model)
                model.backend = BackendConfig(attn=attn)
                if config is not None:
                    model.config = config
                return model

            models = {a: instance(a) for a in ATTENTION_BACKENDS}  # ModelSupports holds only a weak reference
            supports = ModelSupports(models["te"], None)
            cp_attn = frozenset(a for a, m in models.items() if ModelSupports(m, None).supports_cp)
        else:
            import transformers

            cls = getattr(transformers, architecture)
            with torch.device("meta"):
                model = cls(_tiny_config(cls.config_class.model_type))
            supports = ModelSupports(model, None)
            cp_attn = None if supports.supports_cp else frozenset()
        caps = {"tp": supports.supports_tp, "pp": supports.supports_pp, "ep": supports.supports_ep, "cp_attn": cp_attn}
    return cls.__module__, caps


@contextlib.contextmanager
def _transformer_engine_stub() -> Iterator[None]:
    """A stand-in ``transformer_engine`` (not installable here) whose ``DotProductAttention`` no module is an
    instance of: AutoModel's CP setup imports it and then, as on a cluster whose model uses SDPA attention,
    configures the other layers (the Mamba ones) and leaves attention to SDPA's own CP."""
    import sys
    import types

    names = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.attention")
    saved = {n: sys.modules.get(n) for n in names}
    mods = {n: types.ModuleType(n) for n in names}
    mods["transformer_engine.pytorch.attention"].DotProductAttention = type("DotProductAttention", (), {})
    mods["transformer_engine"].pytorch = mods["transformer_engine.pytorch"]
    mods["transformer_engine.pytorch"].attention = mods["transformer_engine.pytorch.attention"]
    sys.modules.update(mods)
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


@contextlib.contextmanager
def _cuda_device_index() -> Iterator[None]:
    """``torch.cuda.current_device()`` answers 0 on a machine without CUDA: AutoModel's GLM-4.5 class asks for it
    to name the device of its rotary embedding, which only stores the device (nothing is allocated there)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    with mock.patch.object(torch.cuda, "current_device", lambda: 0):
        yield


def build_and_parallelize(
    architecture: str,
    model_type: str,
    config: dict[str, Any],
    block: dict[str, Any],
    world_size: int,
    *,
    attn: str | None = None,
) -> str | None:
    """What ``NeMoAutoModelForCausalLM`` does with AutoModel's own class for ``architecture`` after its setup for
    ``block``, at rank 0 on the meta device: build it from ``config``, ``attach_capabilities_and_validate`` (its
    ``validate_for_mesh``), then ``parallelize_model`` (with :func:`_transformer_engine_stub`); ``attn``: the
    recipe's ``model.backend.attn`` (else the class's default here, which is not TE without it). The first error
    text, or None."""
    import torch
    from nemo_automodel._transformers.capabilities import attach_capabilities_and_validate
    from nemo_automodel._transformers.registry import get_registry
    from nemo_automodel.components.distributed.model_parallelizer import parallelize_model

    cls = get_registry().get_model_cls_from_model_arch(architecture)
    with _fake_world(world_size), contextlib.redirect_stdout(None), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            setup = _setup(block, world_size)
            with torch.device("meta"), _cuda_device_index():
                if attn is None:
                    model = cls(_tiny_config(model_type, **config))
                else:
                    from nemo_automodel.components.models.common import BackendConfig

                    model = cls(_tiny_config(model_type, **config), backend=BackendConfig(attn=attn))
            attach_capabilities_and_validate(model, setup.mesh_context)
            with _transformer_engine_stub():
                parallelize_model(model, setup.mesh_context)
        except Exception as exc:  # noqa: BLE001 - any failure is AutoModel's verdict
            return f"{type(exc).__name__}: {exc}"
    return None


def pipeline_refusal(architecture: str, model_type: str, *, tied: bool, meta_init: bool = True) -> str | None:
    """AutoModel's pipeline-support check on its class for ``architecture`` built from a tiny config with
    ``tie_word_embeddings=tied``: the error text, or None when it accepts the model. ``meta_init``: built as
    ``NeMoAutoModel*.from_pretrained`` builds it for FSDP2 on more than one rank without quantization (under its
    ``no_init_weights()`` and ``init_empty_weights()``); False: as it builds a quantized model (plain construction)."""
    import torch
    from nemo_automodel._transformers.registry import get_registry
    from nemo_automodel.components.distributed.pipelining.hf_utils import validate_hf_model_for_pipeline_support
    from nemo_automodel.components.utils.model_utils import init_empty_weights
    from transformers.initialization import no_init_weights
    from transformers.utils import ContextManagers

    registry = get_registry()
    config = _tiny_config(model_type, tie_word_embeddings=tied)
    ctx = ContextManagers([no_init_weights(), init_empty_weights()]) if meta_init else torch.device("meta")
    with warnings.catch_warnings(), ctx:
        warnings.simplefilter("ignore")
        if registry.has_custom_model(architecture):
            model = registry.get_model_cls_from_model_arch(architecture)(config)
        else:
            import transformers

            model = getattr(transformers, architecture)(config)
    try:
        validate_hf_model_for_pipeline_support(model)
    except ValueError as exc:
        return f"ValueError: {exc}"
    return None


def default_pipeline_refusal(architecture: str) -> tuple[str | None, dict[str, Any]]:
    """AutoModel's pipeline-support check on its class for ``architecture`` built under its meta init from the
    class's default config (transformers' config class for it): the error's numbered issues (None when it accepts
    the model) and that config as a dict, for the engine to read as a config.json."""
    import transformers
    from nemo_automodel._transformers.registry import get_registry
    from nemo_automodel.components.distributed.pipelining.hf_utils import validate_hf_model_for_pipeline_support
    from nemo_automodel.components.utils.model_utils import init_empty_weights
    from transformers.initialization import no_init_weights
    from transformers.utils import ContextManagers

    registry = get_registry()
    config = getattr(transformers, architecture).config_class()
    config.architectures = [architecture]
    with warnings.catch_warnings(), ContextManagers([no_init_weights(), init_empty_weights()]):
        warnings.simplefilter("ignore")
        if registry.has_custom_model(architecture):
            model = registry.get_model_cls_from_model_arch(architecture)(config)
        else:
            model = getattr(transformers, architecture)(config)
    try:
        validate_hf_model_for_pipeline_support(model)
    except ValueError as exc:
        return str(exc).split("\n\n", 1)[1], config.to_dict()
    return None, config.to_dict()


def packed_cp_refusal(architecture: str, model_type: str, *, force_hf: bool, attn: str, cp_size: int) -> str | None:
    """AutoModel's model-build decision for packed sequences under CP: whether it takes the Hugging Face
    class (``model_init.get_is_hf_model``) and, if so, what ``kernel_patches._apply_preload_overrides``
    says for ``attn`` (``te`` is first turned into ``sdpa``, as ``_build_model`` does)."""
    from nemo_automodel._transformers.kernel_patches import _apply_preload_overrides
    from nemo_automodel._transformers.model_init import get_is_hf_model

    config = _tiny_config(model_type, architectures=[architecture])
    if not get_is_hf_model(config, force_hf):
        return None
    try:
        _apply_preload_overrides(1, cp_size, True, "sdpa" if attn == "te" else attn, False)
    except (ValueError, AssertionError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def megatron_fsdp_log(block: dict[str, Any], world_size: int) -> list[str]:
    """The error/warning lines AutoModel's MegatronFSDP parallelizer logs for ``block`` at rank 0, up to the
    point where it needs the megatron-fsdp package (not installed here). The activation-checkpointing flag
    reaches the strategy config as ``infrastructure._with_activation_checkpointing`` puts it there (a
    ``dataclasses.replace``; that module itself needs torchao, which the oracle does not install)."""
    from dataclasses import replace

    import torch
    from nemo_automodel.components.distributed.megatron_fsdp import parallelize_megatron_fsdp
    from torch import nn

    with _fake_world(world_size) as capture:
        setup = _setup(block, world_size)
        config = replace(setup.strategy_config, activation_checkpointing=setup.activation_checkpointing)
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(8, 8))
        try:
            parallelize_megatron_fsdp(model, config, setup.mesh_context.device_mesh)
        except Exception:  # noqa: BLE001 - it stops where megatron-fsdp is needed
            pass
    return capture.messages


def parallelize_model_class(
    architecture: str, model_type: str, config: dict[str, Any], block: dict[str, Any], world_size: int
) -> str | None:
    """AutoModel's setup for ``block`` and ``parallelize_model`` on its own class for ``architecture`` (or the
    Hugging Face one it would use), built on the meta device from ``config``: the first error text, or None."""
    import torch
    from nemo_automodel._transformers.registry import get_registry
    from nemo_automodel.components.distributed.model_parallelizer import parallelize_model

    registry = get_registry()
    with _fake_world(world_size), contextlib.redirect_stdout(None):  # its Llama class prints on rank 0
        try:
            setup = _setup(block, world_size)
            with torch.device("meta"):
                if registry.has_custom_model(architecture):
                    model = registry.get_model_cls_from_model_arch(architecture)(_tiny_config(model_type, **config))
                else:
                    import transformers

                    model = getattr(transformers, architecture)(_tiny_config(model_type, **config))
            parallelize_model(model, setup.mesh_context)
        except Exception as exc:  # noqa: BLE001 - any failure is AutoModel's verdict
            return f"{type(exc).__name__}: {exc}"
    return None


def raised_messages(relpath: str, filler: str = "8") -> list[str]:
    """Every ``raise X("...")`` message in AutoModel's source file ``relpath`` (under the package), as
    "X: text" with each f-string field rendered as ``filler``: the error texts its code can print, read
    from the code itself (for the paths a CPU cannot reach: Transformer Engine, CUDA-only packages)."""
    import ast
    import pathlib

    import nemo_automodel

    def text(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else filler for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = text(node.left), text(node.right)
            return None if left is None or right is None else left + right
        return None

    tree = ast.parse((pathlib.Path(nemo_automodel.__file__).parent / relpath).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            message = text(node.exc.args[0])
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "Error")
            if message is not None:
                out.append(f"{name}: {message}")
    return out


def block_reshards(block: dict[str, Any], world_size: int, n_blocks: int = 4) -> list[bool]:
    """Whether AutoModel 0.7.0's own dense FSDP2 wrapping (``apply_fsdp2_sharding_recursively`` on the
    data-parallel mesh ``get_fsdp_dp_mesh`` gives it, as its parallelizer calls them) reshards each of
    ``n_blocks`` blocks after forward, for ``{"distributed": block}`` at ``world_size``."""
    from nemo_automodel.components.distributed.mesh_utils import get_fsdp_dp_mesh
    from nemo_automodel.components.distributed.parallelizer import apply_fsdp2_sharding_recursively
    from torch import nn

    with _fake_world(world_size):
        setup = _setup(block, world_size)
        dp_mesh = get_fsdp_dp_mesh(setup.mesh_context.device_mesh, "dp_replicate", "dp_shard_cp")
        layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(n_blocks)])
        apply_fsdp2_sharding_recursively(
            layers, dp_mesh, None, reshard_after_forward=setup.strategy_config.reshard_after_forward
        )
        return [layer._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None for layer in layers]


def module_function(relpath: str, name: str) -> Callable[..., Any]:
    """The top-level function ``name`` of AutoModel's source file ``relpath``, compiled from that file with the
    names it uses imported from where the file imports them: for modules whose own import needs packages that
    are not installed here (recipes/llm/train_ft.py imports torchao and torchdata at the top)."""
    import ast
    import builtins
    import importlib
    import pathlib

    import nemo_automodel

    path = pathlib.Path(nemo_automodel.__file__).parent / relpath
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    namespace: dict[str, Any] = {"logger": logging.getLogger(relpath)}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) in used:
                    namespace[alias.asname or alias.name] = getattr(importlib.import_module(node.module), alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname in used:
                    namespace[alias.asname] = importlib.import_module(alias.name)
    missing = used - set(namespace) - set(dir(builtins))
    missing -= {a.arg for a in ast.walk(fn) if isinstance(a, ast.arg)}
    missing -= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    assert not missing, f"{relpath}:{name} uses names not imported at its top level: {sorted(missing)}"
    exec(compile(ast.Module([fn], []), str(path), "exec"), namespace)  # noqa: S102 - AutoModel's own source
    return namespace[name]


def checkpoint_config(data: dict[str, Any]) -> tuple[Any, str | None, list[str]]:
    """``RecipeConfig(ConfigNode(data)).checkpoint`` as the LLM recipe builds it: (the CheckpointingConfig or None,
    the error text it raised, the warnings it logged)."""
    from nemo_automodel.components.config.loader import ConfigNode
    from nemo_automodel.recipes._typed_config import RecipeConfig

    capture = _Capture()
    root = logging.getLogger()
    root.addHandler(capture)
    try:
        return RecipeConfig(ConfigNode(copy.deepcopy(data))).checkpoint, None, capture.messages
    except Exception as exc:  # noqa: BLE001 - any failure is AutoModel's verdict
        return None, f"{type(exc).__name__}: {exc}", capture.messages
    finally:
        root.removeHandler(capture)


def pipeline_loss(architecture: str, model_type: str, config: dict[str, Any], loss: str, **pipeline: Any) -> str:
    """What llm/train_ft.py trains with under pipeline parallelism: AutoModel's class for ``architecture`` (or the
    Hugging Face one with ``force_hf``) built on the meta device, given the stage forward AutoModel's pipeline
    split gives it (functional.py: ``patch_hf_model_for_pp`` unless the class keeps its own), then
    ``_maybe_downgrade_loss_fn`` run from train_ft's source. The loss class name, or the error it raised."""
    import importlib

    import torch
    import transformers
    from nemo_automodel._transformers.registry import get_registry
    from nemo_automodel.components.distributed.pipelining.hf_utils import (
        model_keeps_self_forward,
        patch_hf_model_for_pp,
    )

    force_hf = pipeline.pop("force_hf", False)
    modules = {
        "FusedLinearCrossEntropy": "nemo_automodel.components.loss.linear_ce",
        "ChunkedCrossEntropy": "nemo_automodel.components.loss.chunked_ce",
        "MaskedCrossEntropy": "nemo_automodel.components.loss.masked_ce",
    }
    loss_fn = getattr(importlib.import_module(modules[loss]), loss)()
    registry = get_registry()
    with warnings.catch_warnings(), torch.device("meta"), _cuda_device_index():
        warnings.simplefilter("ignore")
        if registry.has_custom_model(architecture) and not force_hf:
            cls = registry.get_model_cls_from_model_arch(architecture)
        else:
            cls = getattr(transformers, architecture)
        model = cls(_tiny_config(model_type, **config))
    if not model_keeps_self_forward(model):
        patch_hf_model_for_pp(
            model,
            patch_inner_model=pipeline.get("patch_inner_model", True),
            patch_causal_lm_model=pipeline.get("patch_causal_lm_model", True),
        )
    downgrade = module_function("recipes/llm/train_ft.py", "_maybe_downgrade_loss_fn")
    try:
        return type(downgrade(loss_fn, model, True)).__name__
    except ValueError as exc:
        return f"ValueError: {exc}"
