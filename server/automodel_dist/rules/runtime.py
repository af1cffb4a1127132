"""Failures that only happen at run time (OOM, collective timeouts, ...): in the rule table so that
``explain_error`` explains them with the same lookup as the config rules."""

from __future__ import annotations

from .base import note

F = "runtime"
# Failures that only happen at run time: in the table so one lookup explains them too.
note(
    "runtime-oom",
    "Out of GPU memory",
    family=F,
    severity="error",
    patterns=(
        r"CUDA out of memory",
        r"OutOfMemoryError",
        r"Tried to allocate [\d.]+ [GM]iB",
        r"Cuda failure '?out of memory",
        r"CUBLAS_STATUS_ALLOC_FAILED",
    ),
    cause="Parameters, gradients, optimizer states and activations of this layout exceed the GPU's memory.",
    fix="Run `automodel-dist estimate` / `suggest`: raise dp sharding (FSDP2), add tp/pp, enable activation "
    "checkpointing, or lower the micro batch.",
)
note(
    "runtime-collective-timeout",
    "Collective timed out",
    family=F,
    severity="error",
    patterns=(
        r"Watchdog caught collective operation timeout",
        r"NCCL.*[Tt]imeout",
        r"ProcessGroupNCCL.*timed out",
        r"Timed out waiting .* for (recv|send|collective)",
        r"gloo.*[Tt]imeout",
    ),
    cause="One rank stopped (crashed, hung, or took a different code path) while its peers waited in a "
    "collective; the real error is usually on another rank.",
    fix="Look for the first failing rank's traceback; reproduce with `automodel-dist smoke` and a short timeout.",
    consequence=True,
)
note(
    "runtime-checkpoint-straggler",
    "A collective timed out inside a checkpoint save",
    family=F,
    severity="error",
    patterns=(r"Failed to synchronize safetensors consolidation status across ranks",),
    cause="The timeout fell inside a checkpoint save (after 'Saving checkpoint to' or 'Consolidating safetensors "
    "files from', before the save finished): no rank failed; the few ranks doing the save's file work (rank 0, "
    "or the ranks a consolidated Hugging Face export gave output files) took longer than the others were allowed "
    "to wait.",
    fix="save_consolidated: false (or final) and bash <checkpoint>/model/consolidate.sh after training, off the job; "
    "raise dist_env.timeout_minutes (the recipes' default is 1 minute) and checkpoint.consolidation_timeout_minutes "
    "(30); single_rank_consolidation: false; staging_dir on a local disk; `automodel-dist validate` with the model "
    "and cluster size says how much each rank writes.",
)
note(
    "runtime-host-oom",
    "A rank was killed (SIGKILL), usually for host memory",
    family=F,
    severity="error",
    patterns=(
        r"exitcode\s*:\s*-9\b",
        r"Signal 9 \(SIGKILL\) received",
        r"<Signals\.SIGKILL: 9>",
        r"Out of memory: Killed process",
    ),
    cause="A rank process was killed with SIGKILL, which leaves no Python traceback: most often the kernel's OOM "
    "killer when the node's host RAM runs out (every rank of the node holding a full copy of the weights while "
    "loading a checkpoint, dataloader workers, pinned buffers), or the scheduler enforcing the job's memory "
    "limit.",
    fix="Read `dmesg` / `journalctl -k` on the node for 'Out of memory: Killed process' and the scheduler's memory "
    "accounting; request more host memory per node (Slurm --mem), lower dataloader num_workers, or run fewer "
    "ranks per node; GPU memory is not the cause here.",
)
note(
    "runtime-child-failed",
    "torchrun's summary of a failed rank",
    family=F,
    severity="error",
    patterns=(r"ChildFailedError", r"Failures:\s*\n\s*<NO_OTHER_FAILURES>", r"Root Cause \(first observed failure\)"),
    cause="torchrun reports that a rank exited with an error; the rank's own error is earlier in the log (lines "
    "prefixed [rankN]:) or in its log file, and 'traceback : Signal N' means it was killed by a signal.",
    fix="Find the root-cause rank torchrun names and read its own traceback (paste the whole log here); an exit code "
    "of -9 or SIGKILL points at host memory, -6/SIGABRT at a C++ abort (NCCL, CUDA).",
    consequence=True,
)
note(
    "runtime-dtensor-mesh",
    "FSDP and TP on different meshes",
    family=F,
    severity="error",
    patterns=(r"Expected param's DTensor mesh to be the same mesh",),
    cause="FSDP2's data-parallel mesh must be a submesh of the same root mesh TP uses.",
    fix="Use AutoModel's own meshes (get_fsdp_dp_mesh on the device_mesh); do not build a second mesh.",
)
note(
    "runtime-mixed-dtensor",
    "Mixed Tensor and DTensor in CP attention",
    family=F,
    severity="error",
    patterns=(r"got mixed torch\.Tensor and DTensor",),
    cause="Context-parallel attention received a plain tensor beside DTensors (e.g. a mask or rotary buffer).",
    fix="Run attention under implicit_replication(), or let AutoModel's CP path strip masks (causal SDPA).",
)
note(
    "runtime-moe-ac-recompute",
    "MoE router recomputed under activation checkpointing",
    family=F,
    severity="error",
    patterns=(r"CheckpointError", r"Recomputed values for the following tensors have different metadata"),
    cause="With activation checkpointing, recomputing the MoE router's top-k can route a different number of "
    "tokens per expert than the forward pass did.",
    fix="Keep moe.ignore_router_for_ac: true (the default) so router outputs are saved, not recomputed.",
)
note(
    "runtime-mesh-rank",
    "Rank outside the device mesh",
    family=F,
    severity="error",
    patterns=(r"it needs to contain the local rank",),
    cause="An explicit dp_size made the mesh smaller than the world; the ranks outside cannot slice it.",
    fix="Remove dp_size (AutoModel infers it) or make dp*tp*cp*pp equal the world size.",
)
note(
    "runtime-missing-package",
    "A package the layout or backend needs is not installed",
    family=F,
    severity="error",
    patterns=(
        r"MegatronFSDP is not installed",
        r"unsupported Megatron-FSDP fully_shard API",
        r"cannot determine the installed Megatron-FSDP fully_shard API",
        r"Transformer Engine attention is required",
        r"'magi_attention' package is not importable",
        r"No module named '(transformer_engine|megatron_fsdp|megatron|deep_ep|magi_attention)(?:\.[\w.]*)?'",
        r"backend\.attn='cudnn' requires the optional cuDNN DSA and FlashMLA kernels",
        r"GLM-5\.2 cuDNN DSA requires both nvidia-cudnn-frontend",
        r"cuDNN sparse attention requires both nvidia-cudnn-frontend",
        r"(glm_moe_dsa|dsv4) [\w\s]{1,40}? TileLang backend was requested, but the optional kernel is",
    ),
    cause="The job's environment lacks a package the config needs: strategy megatron_fsdp needs megatron-fsdp "
    "0.5.0 exactly (nemo-automodel 0.7.0 depends on it, but an image built with --no-deps or an upgraded one "
    "lacks it or fails on its fully_shard signature); model.backend.attn: te (which context parallelism needs "
    "for most models) needs Transformer Engine, from the cuda extra; model.backend.dispatcher: deepep needs "
    "DeepEP, from the moe extra; attn: magi needs MagiAttention, built from source. The sparse-attention (DSA) "
    "classes' kernels: GLM-5.2's attn: cudnn needs nvidia-cudnn-frontend[cutedsl] (the cuda extra) and FlashMLA "
    "with flash_mla_sparse_fwd (in no extra), and raises without either rather than fall back; attn: tilelang "
    "(GLM-5.2, DeepSeek-V4) needs tilelang (the cuda extra), and its check raises too where the inputs are not CUDA bf16 tensors "
    "(a CPU run, or a model left in fp32).",
    fix="Install it in the launch image (pip install 'nemo-automodel[cuda,moe]==0.7.0', or megatron-fsdp==0.5.0; "
    "FlashMLA from its own repository), or choose what needs none: strategy fsdp2, model.backend.attn: sdpa with "
    "cp_size 1, dispatcher: torch. GLM-5.2: the other of attn cudnn and tilelang, or te, whose dense path holds a "
    "seq x seq mask per head; DeepSeek-V4: any attn but tilelang runs its eager attention (every head's scores "
    "over the sequence), and its context parallelism needs tilelang.",
)
note(
    "runtime-dsa-gpu",
    "GLM-5.2's cuDNN sparse attention on a GPU it does not run on",
    family=F,
    severity="error",
    patterns=(r"cuDNN DSA (sparse attention|indexer) requires (SM90 or later|CUDA tensors)",),
    cause="model.backend.attn: cudnn runs GLM-5.2's sparse attention through cuDNN Frontend's CuTe DSL kernels and "
    "FlashMLA, which need an SM90 or later GPU (H100, H200, B200) and the model's tensors on it: AutoModel's adapter "
    "raises in the first forward on an A100 (SM80) or on the CPU.",
    fix="Run on SM90 or later, or set model.backend.attn: te for GLM-5.2 (its dense path holds a seq x seq mask per "
    "head: check the memory with the dry run).",
)
# Launch and transport failures: the config is fine, the processes or the machines are not.
note(
    "runtime-nccl-system",
    "NCCL could not set up or keep its transport",
    family=F,
    severity="error",
    patterns=(
        r"unhandled system error",
        r"ncclSystemError",
        r"remote process exited or there was a network error",
        r"ncclRemoteError",
        r"Error while (creating|attaching to) shared memory segment",
    ),
    cause="A system call inside NCCL failed or a peer vanished: most often /dev/shm too small or not shared in a "
    "container (Docker's default is 64 MB), NCCL picking a network interface the nodes cannot reach each "
    "other on, an InfiniBand/RoCE or firewall problem between nodes, or another rank that died first.",
    fix="Rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) and read the first WARN line; in containers run "
    "with --ipc=host or a large --shm-size; set NCCL_SOCKET_IFNAME (and NCCL_IB_HCA) to the interfaces the "
    "nodes share; check the other ranks' logs for an earlier failure.",
    consequence=True,
)
note(
    "runtime-duplicate-gpu",
    "Two ranks on one GPU",
    family=F,
    severity="error",
    patterns=(r"Duplicate GPU detected",),
    cause="Two ranks of one communicator use the same GPU: the processes were not each given their own device "
    "(LOCAL_RANK), e.g. every process sees the same single device through CUDA_VISIBLE_DEVICES, or a script "
    "sets one fixed device.",
    fix="Launch with torchrun / `automodel ... --nproc-per-node N` (AutoModel sets the device from LOCAL_RANK); do "
    "not pin CUDA_VISIBLE_DEVICES or torch.cuda.set_device to one GPU per node for all ranks.",
)
note(
    "runtime-invalid-device",
    "More ranks than GPUs on a node",
    family=F,
    severity="error",
    patterns=(r"invalid device ordinal",),
    cause="A rank's LOCAL_RANK names a GPU the node does not have: --nproc-per-node is larger than the GPUs "
    "visible on the node (nvidia-smi -L, CUDA_VISIBLE_DEVICES).",
    fix="Make --nproc-per-node the number of visible GPUs, then re-validate: the world size (and so dp and every "
    "divisibility rule) changes with it.",
)
note(
    "runtime-port-in-use",
    "Rendezvous port already in use",
    family=F,
    severity="error",
    patterns=(r"EADDRINUSE", r"server socket has failed to listen", r"[Aa]ddress already in use"),
    cause="Another job, or a process left over from an earlier run, holds the rendezvous port (29500 by default) "
    "on the head node.",
    fix="Pass a free port (torchrun --master-port, or --rdzv-endpoint HOST:PORT), or stop the leftover processes.",
)
note(
    "runtime-rendezvous",
    "Not every process reached the rendezvous",
    family=F,
    severity="error",
    patterns=(
        r"waiting for clients\. \d+/\d+ clients joined",
        r"RendezvousTimeoutError",
        r"client socket has timed out after .* while trying to connect",
        r"client socket has failed to connect to",
    ),
    cause="Some processes never joined the head node: fewer nodes were started than --nnodes says, a node has the "
    "wrong head address (MASTER_ADDR / --rdzv-endpoint) or rendezvous id, a firewall blocks the port, or a "
    "node failed before it joined.",
    fix="Start the same command on every node with the same --nnodes, --rdzv-id and head address; open the port "
    "between nodes; read the logs of the nodes that did not join.",
)
