"""The rule table. Importing this package registers every rule (one module per family)."""

from . import automodel, checkpoint, cluster, fallbacks, forward, freeze, model, parallelize, recipe, runtime  # noqa: F401
from .base import RULES, Context, Rule, note, run_rules

F = "input"
note(
    "yaml-syntax",
    "YAML does not parse",
    family=F,
    severity="error",
    patterns=(r"(ScannerError|ParserError|while scanning|while parsing)",),
    cause="The text is not valid YAML (often a tab used for indentation).",
    fix="Fix the YAML at the line shown.",
)
note("yaml-too-large", "Config over the size cap", family=F, severity="error")
note("yaml-not-utf8", "Config is not UTF-8", family=F, severity="error")
note(
    "yaml-multiple-documents",
    "More than one YAML document",
    family=F,
    severity="error",
    patterns=(r"expected a single document in the stream",),
    cause="AutoModel loads recipes with yaml.safe_load, which rejects '---' separated documents.",
    fix="Keep one document per recipe.",
)
note(
    "yaml-duplicate-key",
    "Duplicate key",
    family=F,
    severity="error",
    cause="PyYAML keeps the last of two equal keys and silently drops the first.",
    fix="Keep one of them.",
)
note("yaml-too-deep", "YAML nested too deeply", family=F, severity="error")
note("yaml-too-complex", "YAML alias expansion too large", family=F, severity="error")
note("yaml-empty", "Empty config", family=F, severity="error")
note(
    "yaml-unsafe-tag",
    "YAML tag that is not a plain type",
    family=F,
    severity="error",
    patterns=(r"could not determine a constructor for the tag",),
    cause="A tag such as !!python/object/apply asks the loader to build or call an object; safe loaders refuse it.",
    fix="Remove the tag and write the plain value.",
)
note("yaml-bad-key", "Non-scalar mapping key", family=F, severity="error")
note("yaml-root-not-mapping", "Config is not a mapping", family=F, severity="error")
note(
    "distributed-invalid",
    "distributed: is not a mapping",
    family=F,
    severity="error",
    patterns=(r"'NoneType' object is not iterable",),
    cause="A bare `distributed:` line is YAML null.",
    fix="Write `distributed: {}` or give its keys.",
)
note(
    "target-path-invalid",
    "_target_ or *_fn value that is not an import path",
    family=F,
    severity="error",
    patterns=(
        r"Cannot resolve target \(blocked or not found\): (.*)",
        r"Left side of ':' must be a \.py file",
        r"Python script does not exist: (.*)",
        r"Module '[^']*' loaded, but cannot resolve attribute",
    ),
    cause="AutoModel's ConfigNode imports every _target_ and *_fn string when it loads the recipe (dotted "
    "package.module.attr, or file.py:attr); a value that is not such a path, or names a module, file or "
    "attribute missing on the machine, fails before training starts.",
    fix="Write a dotted import path or path/to/file.py:attr that exists where the job runs "
    "(out-of-tree modules need NEMO_ENABLE_USER_MODULES=1 or to be on PYTHONPATH).",
)
note("no-distributed-section", "Recipe without distributed:", family=F, severity="info")
note("env-var", "Value from an environment variable", family=F, severity="warning")
note("file-unreadable", "File cannot be read", family=F, severity="error")
note("file-not-allowed", "File outside the allowed roots", family=F, severity="error")
note("world-size-invalid", "World size is not a usable positive integer", family=F, severity="error")
note("world-from-ci", "World size taken from the recipe's ci: block", family=F, severity="info")
note("internal-error", "A rule failed to run", family=F, severity="warning")
note("recipe-kind", "A config kind with no distributed setup to check", family=F, severity="info")
note(
    "recipe-distributed-ignored",
    "distributed: that this kind of recipe never reads",
    family=F,
    severity="warning",
    patterns=(r"Cannot specify both 'fsdp' and 'ddp' configurations",),
    cause="TrainDiffusionRecipe builds its setup from fsdp: or ddp: (not both), MineHardNegativesRecipe only starts "
    "the process group: a distributed: block there changes nothing.",
    fix="Put the settings where the recipe reads them (fsdp: / ddp: for diffusion), or remove them.",
)
note("override-applied", "Value set by a command-line override", family=F, severity="info")
note(
    "override-invalid",
    "Command-line override that AutoModel cannot apply",
    family=F,
    severity="error",
    patterns=(r"Expected a path after --config", r"You must specify --config <path>"),
    cause="An override that is not dotted.key=value (AutoModel splits each at '='), or a launch command whose "
    "-c/--config has no recipe path.",
    fix="Write overrides as --distributed.tp_size=4 or --distributed.tp_size 4, and give -c/--config a path.",
)

__all__ = ["RULES", "Context", "Rule", "run_rules"]
