"""Typed shape of the failure catalog and of a diagnosis.

The catalog is data: one YAML file per failure signature in `diagnose/signatures/<id>.yaml` (id = file
stem, semgrep-style), each carrying its own example lines that must match and lines that must not. These
models are the contract those files meet; they are frozen and `extra="forbid"` so a typo fails at load.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Category = Literal[
    "shm_bus_error",
    "master_port_in_use",
    "hccl_port_in_use",
    "stale_process",
    "comm_timeout",
    "device_oom",
    "host_oom",
    "killed_by_signal",  # SIGKILL/SIGTERM from outside the job with no sign of the OOM killer
    "disk_full",
    "cann_env",
    "version_mismatch",
    "missing_dependency",
    "dependency_version",
    "checkpoint_not_found",
    "checkpoint_parallel_mismatch",
    "checkpoint_unconverted",
    "checkpoint_optimizer_state",
    "config_invalid",
    "data_format",
    "device_fault",
    "device_invalid",
    "nan_loss",
    "crlf_script",
    "unknown",  # a failure was seen (a generic wrapper such as ChildFailedError) but no known cause matched
    "none",
]
CATEGORIES: tuple[Category, ...] = get_args(Category)

# Where in the pipeline a signature shows up; "launch" covers torchrun/rendezvous/comm init, "any" is
# for symptoms that can appear anywhere (wrappers, OOM killer).
SignatureStage = Literal[
    "env_setup",
    "model_deps",
    "weights",
    "data_prep",
    "feature_extraction",
    "launch",
    "training",
    "inference",
    "export",
    "any",
]

# A primary signature is a cause; a secondary one is what a cause leaves behind on this or other ranks
# (wrappers, ChildFailedError, timeouts after a peer died). Secondary signatures win only when no primary
# one was seen at all.
Role = Literal["primary", "secondary"]

# fatal: the process dies or hangs; silent: training goes on but is wrong (random init, NaN);
# warning: worth knowing, not a failure on its own (CPU fallback of an op); noise: a line healthy runs print
# too (torch's IPv6 lookup notice, exit-time warnings) that looks like an error: it is listed (category
# `none`) so nobody mistakes it for the cause, it takes its line from every other signature, and it is never
# the root cause.
Effect = Literal["fatal", "silent", "warning", "noise"]
# The effects of failures: a finding with one of them, seen before a stop from outside, was why it stopped.
FailureEffect = Literal["fatal", "silent"]

# Fix actions, ordered from the lightest to the heaviest (DLRover's recovery ladder). The fixes of a
# signature must be listed in this order.
FixAction = Literal["inspect", "retry", "env", "config", "data", "reconvert", "reinstall", "hardware"]
FIX_ORDER: tuple[FixAction, ...] = get_args(FixAction)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Fix(_Frozen):
    action: FixAction
    text: str = Field(min_length=1, description="what to do, imperative; may use {named} regex groups")
    command: str | None = Field(default=None, description="a command that does it, when there is one")


class Examples(_Frozen):
    match: list[str] = Field(min_length=1, description="log lines this signature must match")
    no_match: list[str] = Field(
        default_factory=list, description="look-alike lines it must not match (healthy or other signatures)"
    )
    context: list[str] = Field(
        default_factory=list,
        description="for a rule with `context`: lines logged before each `match` line that put it in that "
        "context (a checkpoint being loaded before a SIGKILL)",
    )
    out_of_context: list[str] = Field(
        default_factory=list,
        description="for a rule with `context`: lines logged before a `match` line under which the rule must "
        "not apply (training iterations after the load: that phase was over)",
    )


class Context(_Frozen):
    """What a log said just before a line, for a rule that only holds in that situation: a SIGKILL while the
    checkpoint is loading is most likely the host OOM killer; the same SIGKILL mid-training says nothing."""

    lines: int = Field(
        default=60,
        ge=1,
        le=400,
        description="non-blank lines of the same file before the hit that are looked at (within the "
        "scanner's 16 KiB look-back)",
    )
    during: list[str] = Field(
        min_length=1,
        description="Python regexes of the phase the rule needs (`loading checkpoint`, `building ... model`): "
        "the latest of those lines that matches `during` or `after` must match `during`",
    )
    after: list[str] = Field(
        default_factory=list,
        description="Python regexes of lines that end that phase (a training iteration line)",
    )


UpstreamRepo = Literal["MindSpeed-MM", "MindSpeed", "Megatron-LM"]


class UpstreamSource(_Frozen):
    """Where the message a signature matches is written in the framework's own source."""

    repo: UpstreamRepo = Field(description="the project whose source writes the message")
    file: str = Field(
        min_length=1,
        max_length=300,
        description="path inside that project's tree, e.g. megatron/training/arguments.py",
    )
    text: str = Field(
        min_length=8,
        max_length=300,
        description="a literal fragment of the message (or of the source line a traceback shows) as the "
        "file spells it, `{}`/`%s` placeholders included",
    )

    @field_validator("file")
    @classmethod
    def _relative_path(cls, value: str) -> str:
        parts = value.split("/")
        if value.startswith("/") or "\\" in value or any(part in {"", ".", ".."} for part in parts):
            raise ValueError(
                "file must be a relative POSIX path inside the project's tree (no '..', no '//')"
            )
        return value

    @field_validator("text")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value or value != value.strip():
            raise ValueError("text must be one line without surrounding spaces, copied from the source file")
        return value


class Claim(_Frozen):
    """Lines of another rule that name the same thing (a PID) as this rule's line are this rule's symptoms."""

    rule: str = Field(description="id of the rule whose lines this one explains (e.g. killed_by_signal)")
    group: str = Field(description="named regex group both rules capture (e.g. pid)")


class Signature(_Frozen):
    id: str = Field(description="stable rule id = file stem, lower_snake_case")
    category: Category
    title: str = Field(min_length=1, description="one line; may use {named} regex groups")
    stage: SignatureStage
    role: Role
    effect: Effect
    triggers: list[str] = Field(
        min_length=1,
        description="cheap prefilter regexes (RE2/ERE subset: no lookaround, no backrefs); a line is only "
        "tested against `patterns` when it matches one of these",
    )
    patterns: list[str] = Field(min_length=1, description="Python regexes; any match = this signature")
    yields_to: list[str] = Field(
        default_factory=list,
        description="rule ids that, when seen anywhere in the inputs, are the cause instead: this finding "
        "then counts as their symptom (a bare SIGKILL yields to the kernel's OOM-killer record)",
    )
    yields_to_earlier: list[FailureEffect] = Field(
        default_factory=list,
        description="effects of other rules' primary findings that, logged before this rule's first line, "
        "make this finding their consequence: a Ctrl-C or scancel after the loss went NaN is someone "
        "stopping a run that had already gone wrong. Symptoms (secondary), generic wrappers and rules of "
        "this rule's own category do not count",
    )
    context: Context | None = Field(
        default=None,
        description="the lines before a hit that this rule needs; where they hold, it takes the line from "
        "the rules without a context (a SIGKILL while loading is the host OOM killer's, not an outside kill)",
    )
    details: list[str] = Field(
        default_factory=list,
        description="Python regexes with named groups for the lines that directly follow a hit (in any order, "
        "one per line) and add their groups to it: the `file:`/`field:`/`fix:` lines after an `error:` line. "
        "A trigger must fire on those lines too",
    )
    requires: list[str] = Field(
        default_factory=list,
        description="named groups a hit must have, from its own line or its detail lines, to count at all "
        "(an `error:` line counts only with the `fix:` line after it)",
    )
    claims: list[Claim] = Field(
        default_factory=list,
        description="rules whose lines, when they capture the same `group` value as a line of this rule seen "
        "before them, count as this rule's instead (torchrun's teardown SIGKILL of PID N explains the "
        "`exitcode: -9 (pid: N)` line after it)",
    )
    handled: bool = Field(
        default=False,
        description="the line reports an error the program caught and went on from (a data set that skips "
        "a sample it cannot read and takes another): it takes the line from the other specific rules, which "
        "would read the quoted error as the run's failure. Only for warnings",
    )
    generic: bool = Field(
        default=False,
        description="a catch-all (e.g. any `No module named`): applies to a line only when no specific "
        "signature matched that line",
    )
    cause: str = Field(min_length=1)
    fixes: list[Fix] = Field(min_length=1, description="ordered from the lightest action to the heaviest")
    env_vars: list[str] = Field(default_factory=list, description="environment variables worth citing")
    docs: list[str] = Field(default_factory=list, description="where this is documented (URL or repo path)")
    examples: Examples
    upstream: list[UpstreamSource] = Field(
        default_factory=list,
        description="where MindSpeed-MM, MindSpeed or Megatron-LM write the matched message; the fidelity "
        "tests check each fragment against the real source (tests/fidelity/test_signatures_upstream.py)",
    )

    @field_validator("id")
    @classmethod
    def _id_format(cls, value: str) -> str:
        if not value.replace("_", "").isalnum() or value.lower() != value:
            raise ValueError("id must be lower_snake_case")
        return value

    @field_validator("fixes")
    @classmethod
    def _fixes_light_to_heavy(cls, fixes: list[Fix]) -> list[Fix]:
        ranks = [FIX_ORDER.index(f.action) for f in fixes]
        if ranks != sorted(ranks):
            order = " < ".join(FIX_ORDER)
            raise ValueError(f"fixes must go from the lightest action to the heaviest ({order})")
        return fixes

    @model_validator(mode="after")
    def _none_is_noise(self) -> Signature:
        """Category `none` (nothing is wrong) is for noise, and noise is never a category of failure."""
        if (self.category == "none") != (self.effect == "noise"):
            raise ValueError(
                "category 'none' goes with effect 'noise' and only with it: noise is a healthy line, "
                "every other effect names a failure's category"
            )
        return self

    @model_validator(mode="after")
    def _handled_is_a_warning(self) -> Signature:
        """An error the program caught and went on from is worth knowing, never the run's failure."""
        if self.handled and self.effect != "warning":
            raise ValueError("handled: true is for warnings: the program went on after the error it reports")
        return self

    @model_validator(mode="after")
    def _context_examples(self) -> Signature:
        """A rule with a context shows its examples after the lines that set it; other rules have none."""
        if self.context is not None and not self.examples.context:
            raise ValueError("a rule with a context needs examples.context: the lines before each match line")
        if self.context is None and (self.examples.context or self.examples.out_of_context):
            raise ValueError("examples.context and examples.out_of_context are for rules with a context")
        return self


# --- diagnosis result (what diagnose_errors returns) -------------------------------------------------


class Evidence(BaseModel):
    file: str
    line: int = Field(description="1-based line number in that file (\\n-separated)")
    text: str = Field(description="the line, ANSI codes removed, cut to 500 characters")


class Finding(BaseModel):
    category: Category
    rule_id: str
    title: str
    role: Role
    effect: Effect
    stage: SignatureStage
    ranks: list[int] = Field(default_factory=list, description="ranks whose logs show it (when known)")
    count: int = Field(description="matching lines over all inputs")
    first_seen: str | None = Field(default=None, description="timestamp of the first occurrence, if logged")
    evidence: list[Evidence] = Field(description="first few matching lines")
    cause: str
    fixes: list[Fix]
    env_vars: list[str] = Field(default_factory=list)
    docs: list[str] = Field(default_factory=list)


LossTrend = Literal["decreasing", "flat", "increasing", "unknown"]


class Progress(BaseModel):
    """Where training got to, from sampled Megatron iteration lines (reference §5.6)."""

    iteration: int | None = Field(default=None, description="last iteration logged")
    total_iterations: int | None = None
    first_loss: float | None = Field(default=None, description="first finite loss logged")
    last_loss: float | None = Field(default=None, description="last loss logged (null when it was nan)")
    loss_trend: LossTrend = Field(
        default="unknown", description="first third of the sampled losses against the last third"
    )
    step_time_ms: float | None = Field(default=None, description="elapsed time per iteration, last seen")
    nan_iterations: int = Field(default=0, description="sum of `number of nan iterations` over the log")
    checkpoints_saved: int = 0


class DiagnosisReport(BaseModel):
    category: Category = Field(description="the root cause's category, or 'none' when nothing is wrong")
    root_cause: Finding | None
    findings: list[Finding] = Field(description="every signature seen, root cause first, then by time")
    progress: Progress
    files: list[str] = Field(description="inputs read")
    skipped: list[str] = Field(default_factory=list, description="files not read, with the reason")
    notes: list[str] = Field(default_factory=list, description="what limited the reading (long lines, ...)")
    lines: int = Field(description="lines read over all inputs")
    bytes: int = Field(description="bytes read (decompressed) over all inputs")
