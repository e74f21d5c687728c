"""MCP server: a thin adapter from MCP tool calls, resources and prompts to the typed core functions.

Handlers only confine paths to the workspace, call the core function and turn `MMAgentError` into an error the
model can act on (tools: `ToolError`, see `mcptools`; resources: the SDK's resource errors; prompts: an
invalid-params error). This module imports none of the core, so a start answers `initialize` and `tools/list`
(from `toollist` when this code has published its list before) without it: the tools (`mcptools`) load in the
background or on the first call, and resources, prompts and completion (`resources`, `prompts`, `completion`)
on their first use. Nothing here, or in what any of them imports, may pull in torch, diffusers, transformers or
megatron; heavy work runs in subprocesses.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    EmptyResult,
    GetPromptResult,
    InputRequiredResult,
    PromptReference,
    Resource,
    ResourceTemplateReference,
    SetLevelRequestParams,
    Tool,
)
from pydantic import Field

from mm_agent import __version__, httpauth, uris
from mm_agent.errors import MMAgentError, os_error
from mm_agent.guard import TOOL_TIMEOUT_S, Guard
from mm_agent.names import shown, shown_model, text_error
from mm_agent.toollist import ToolList, fingerprint
from mm_agent.wire import serve_readable
from mm_agent.workspace import set_workspace

log = logging.getLogger("mm_agent.server")
T = TypeVar("T")

INSTRUCTIONS = """Tools that take a multimodal model to a running MindSpeed-MM training job on Ascend NPUs.
Typical order: check_environment (what on this machine will break a run) -> list_models or route_model
(turn the user's request into model/task/backend) -> install_deps (dry-run plan; confirm=true installs)
-> render_job (dry run first, then confirm=true to write the job directory) -> validate_configs (fix every
error before spending NPU time). convert_weights turns HF weights into the MindSpeed-MM layout (dry-run plan;
confirm=true starts a background run). extract_features and launch_training start a rendered job's stages
as torchrun jobs (dry run first; confirm=true returns a run id at once). job_status reports on any run
(conversion or job: state, iteration/loss/ETA, root cause when failed), tail_logs shows its log, stop_job
stops it (or, by pid, any process mm-agent started, and nothing else). When a run fails or looks wrong,
diagnose_errors on its logs gives the one root cause with evidence and fixes. prepare_dataset checks a
folder of clips or images against the model's limits and writes its data.json before render_job. A user who
brings their own model (route_model's new_model) gets scaffold_model: MindSpeed-MM's new-model flow, written.
Prompts finetune_generative, finetune_vlm, new_model and recover_failed_run give the whole tool sequence for those
workflows. Resources: mm-agent://models (catalog), mm-agent://models/{model_id} (entry + pipeline),
mm-agent://jobs/{path} (text files of rendered jobs in the workspace), mm-agent://skills/{name} (skills;
also skill://index.json and skill://{name}/SKILL.md, as the Skills extension names them).
Paths are relative to the server's workspace."""


# The modules behind resources, prompts and completion bring the registry, routing and skills: loaded on their
# first use, in the guard's worker thread, so a start (initialize, tools/list) never waits for them.
def _resources() -> ModuleType:
    return importlib.import_module("mm_agent.resources")


def _prompts() -> ModuleType:
    return importlib.import_module("mm_agent.prompts")


def _completion() -> ModuleType:
    return importlib.import_module("mm_agent.completion")


def _read(fn: Callable[[], T]) -> T:
    """Run a resource reader; unknown or refused URIs are the protocol's not-found error (-32602)."""
    try:
        return fn()
    except uris.UnknownResource as exc:
        raise ResourceNotFoundError(shown(exc.render())) from exc
    except MMAgentError as exc:
        raise ResourceError(shown(exc.render())) from exc
    except OSError as exc:
        raise ResourceError(shown(os_error(exc).render())) from exc
    except ValueError as exc:  # as in _call: a non-UTF-8 name or text, with the fix
        if (error := text_error(exc)) is None:
            raise
        raise ResourceError(error.render()) from exc


def _prompt(fn: Callable[[], T]) -> T:
    """Render a prompt; bad arguments reach the client as an invalid-params error with the fix (the SDK
    would otherwise replace any prompt exception by a generic 'Error rendering prompt')."""
    try:
        return fn()
    except MMAgentError as exc:
        raise MCPError(INVALID_PARAMS, shown(exc.render())) from exc


class _Server(MCPServer):
    """An MCPServer whose resources/list also names what exists now (the files of rendered jobs in the
    workspace and the generated skills), and whose tools load from `mm_agent.mcptools` at build time or, when
    a remembered list (`toollist`) can answer `tools/list`, in the background after that answer: a host's start
    (initialize, tools/list) then never waits for the core to import. A call that comes before the tools have
    loaded waits for them."""

    def __init__(
        self,
        root: Path,
        guard: Guard,
        auth_token: str | None = None,
        *,
        trust: tuple[Path, ...] = (),
        remembered: ToolList | None = None,
    ) -> None:
        # With a token, the SDK's own bearer check guards streamable HTTP (401 without it; see httpauth.py).
        super().__init__(
            "mm-agent", version=__version__, instructions=INSTRUCTIONS, **httpauth.server_auth(auth_token)
        )
        self.root = root
        self.guard = guard
        self._trust = trust
        self._remembered = remembered
        self._load_lock = threading.Lock()
        self._loaded = False
        self._loading: asyncio.Future[None] | None = None
        self._checked = False  # the remembered list compared with (or written from) the loaded tools
        self.freeze_loaded = False
        if remembered is None or remembered.tools is None:
            self._load_tools()

    def _load_tools(self) -> None:
        """Register the tools (imports the core; idempotent, safe from any thread). The cyclic collector is held
        off meanwhile (it would walk the growing heap of schemas again and again: ~80 ms of a ~320 ms load);
        with `freeze_loaded` (`serve`), what the load built, which lives as long as the server, is frozen."""
        with self._load_lock:
            if self._loaded:
                return
            collecting = gc.isenabled()
            gc.disable()
            try:
                tools = importlib.import_module("mm_agent.mcptools")
                tools.add_tools(self, self.root, self.guard, self._trust)
                self._loaded = True
            finally:
                if self.freeze_loaded:
                    gc.freeze()
                if collecting:
                    gc.enable()

    async def tools_ready(self) -> None:
        """Wait until the tools are registered: loaded in a worker thread, once, however many callers wait."""
        if not self._loaded:
            await asyncio.shield(self._start_loading())

    def _start_loading(self) -> asyncio.Future[None]:
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load_and_check())
        return self._loading

    async def _load_and_check(self) -> None:
        await asyncio.to_thread(self._load_tools)
        await self.list_tools()  # the list the tools now give, checked against the remembered one

    async def list_tools(self) -> list[Tool]:
        remembered = self._remembered
        if not self._loaded and remembered is not None and remembered.tools is not None:
            self._start_loading()  # the host reads the list and thinks; the tools load meanwhile
            return remembered.tools
        await self.tools_ready()
        tools = await super().list_tools()
        if remembered is not None and not self._checked:
            self._checked = True
            if ToolList.dump(tools) != ToolList.dump(remembered.tools or []):
                if remembered.tools is not None:  # the key missed a change: say so, remember the right list
                    log.warning(
                        "the remembered tool list %s differed from the loaded tools; replaced",
                        remembered.path,
                    )
                    # and tell the clients listening for it (subscriptions/listen) that the list changed
                    await self._subscriptions.publish(ToolsListChanged())
                await asyncio.to_thread(remembered.save, tools)
        return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        await self.tools_ready()
        return await super().call_tool(name, arguments, context)

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        """(The HTTP transport's header check, before a call: the remembered schema until the tools load.)"""
        if not self._loaded and self._remembered is not None and self._remembered.tools is not None:
            return next((t.input_schema for t in self._remembered.tools if t.name == name), None)
        return super()._tool_input_schema(name)

    async def run_stdio_async(self) -> None:
        """stdio, where a line that is not a readable JSON-RPC message (bad JSON, or nested deeper than the
        parser's limit) gets a JSON-RPC error reply instead of the SDK's silence."""
        async with stdio_server() as (read_stream, write_stream):
            await serve_readable(self._lowlevel_server, read_stream, write_stream)

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[Any, Any] | None = None
    ) -> GetPromptResult | InputRequiredResult:
        """The SDK answers an unknown prompt, an argument name the prompt does not take or a missing required
        argument with a bare internal error; name what is wrong instead, as an invalid-params error."""
        listed = {p.name: p for p in await self.list_prompts()}
        if name not in listed:
            raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}; prompts: {', '.join(sorted(listed))}")
        given = arguments or {}
        takes = [a.name for a in listed[name].arguments or []]
        unknown = sorted(set(given) - set(takes))
        if unknown:
            names = ", ".join(repr(u[:64]) for u in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            raise MCPError(
                INVALID_PARAMS, f"prompt {name} has no argument(s) {names}; it takes: {', '.join(takes)}"
            )
        missing = [a.name for a in listed[name].arguments or [] if a.required and a.name not in given]
        if missing:
            raise MCPError(INVALID_PARAMS, f"prompt {name} needs the argument(s): {', '.join(missing)}")
        return shown_model(await super().get_prompt(name, arguments, context))  # a name in it: escaped

    async def list_resources(self) -> list[Resource]:
        fixed = await super().list_resources()
        return [shown_model(r) for r in fixed + await self.guard.run(self._current_resources, _read)]

    def _current_resources(self) -> list[Resource]:
        resources = _resources()
        jobs = [
            Resource(
                uri=ref.uri,
                name=ref.path,
                title="Rendered job file",
                description="A text file of a job rendered by render_job in the workspace (read-only).",
                mime_type="text/plain",
                size=ref.bytes,
            )
            for ref in resources.list_job_files(self.root)
        ]
        skills = [
            Resource(
                uri=f"{uris.SCHEME}skills/{name}",
                name=f"skill {name}",
                title="Agent Skill",
                description="A generated Agent Skill (SKILL.md): which mm-agent tool to call, in what order.",
                mime_type="text/markdown",
            )
            for name in resources.list_skills()
        ]
        return jobs + skills


def build_server(
    workspace: Path,
    allow_roots: Sequence[Path] = (),
    tool_timeout_s: float = TOOL_TIMEOUT_S,
    *,
    trust_mm_roots: Sequence[Path] = (),
    auth_token: str | None = None,
    remember_tools: bool = False,
) -> MCPServer:
    """Create the server; every path argument is confined to `workspace` and the `allow_roots` directories
    the operator named; each call must finish within `tool_timeout_s` (long work runs as background runs).
    `trust_mm_roots`: folders whose MindSpeed-MM checkouts validate_configs(mm_root=...) may run the code of
    (none: it runs no checkout's code, and says so). `auth_token`: the bearer token HTTP clients must send.
    `remember_tools`: answer tools/list from the list this code published before (`toollist`), loading the
    tools in the background; without it (the default) the tools are registered before this returns."""
    root = workspace.resolve()
    # the registry adds this workspace's own models (.mm-agent/models, written by mm-agent new-model)
    set_workspace(root)
    guard = Guard(tuple(Path(r).resolve() for r in allow_roots), tool_timeout_s)
    trust = tuple(Path(r).resolve() for r in trust_mm_roots)
    # (the options that change what tools/list says: validate_configs' annotations follow the trusted checkouts)
    remembered = ToolList(fingerprint({"trusted_checkouts": bool(trust)})) if remember_tools else None
    mcp = _Server(root, guard, auth_token, trust=trust, remembered=remembered)
    _add_resources(mcp, root, guard)
    _add_prompts(mcp, root, guard)
    _add_completion_and_logging(mcp, root, guard)
    return mcp


def _add_resources(mcp: MCPServer, root: Path, guard: Guard) -> None:
    @mcp.resource(
        "mm-agent://models",
        name="models",
        title="MindSpeed-MM model catalog",
        description="Every registry model (id, family, tasks, backends, sizes, converter, versions): what "
        "list_models returns without filters.",
        mime_type="application/json",
    )
    async def models_resource() -> str:
        return await guard.run(lambda: _resources().model_catalog().model_dump_json(indent=2), _read)

    @mcp.resource(
        "mm-agent://models/{model_id}",
        name="model",
        title="One registry model with its pipeline",
        description="The registry entry of a model (by its id from mm-agent://models) and the eight pipeline "
        "stages for its default task and size, as route_model gives them.",
        mime_type="application/json",
    )
    async def model_resource(model_id: str) -> str:
        return await guard.run(lambda: _resources().model_detail(model_id).model_dump_json(indent=2), _read)

    @mcp.resource(
        "mm-agent://jobs/{+path}",
        name="job_file",
        title="A file of a rendered job",
        description="A text file of a job directory rendered by render_job (a directory holding job.yaml), "
        "by its workspace-relative path, e.g. mm-agent://jobs/jobs/wan21/pretrain.sh; the job directory "
        "itself gives a JSON index of its files. Confined to the workspace; hidden, binary and files over "
        f"{uris.MAX_FILE_BYTES // 1024} KiB are refused.",
        mime_type="text/plain",
    )
    async def job_file_resource(path: str) -> str:
        return await guard.run(lambda: shown(_resources().read_job_file(path, root).text), _read)

    @mcp.resource(
        "mm-agent://skills/{name}",
        name="skill",
        title="A generated Agent Skill",
        description="The SKILL.md of a skill built by `mm-agent skills build` (e.g. mindspeed-mm-pipeline).",
        mime_type="text/markdown",
    )
    async def skill_resource(name: str) -> str:
        return await guard.run(lambda: _resources().read_skill(name), _read)

    @mcp.resource(
        "mm-agent://skills/{name}/references/{file}",
        name="skill_reference",
        title="A reference file of a generated Agent Skill",
        description="A file under references/ of a generated skill, as linked from its SKILL.md.",
        mime_type="text/markdown",
    )
    async def skill_reference_resource(name: str, file: str) -> str:
        return await guard.run(lambda: _resources().read_skill(name, file), _read)

    # The same skills the way the MCP Skills extension serves them (see uris.SKILL_SCHEME).
    @mcp.resource(
        uris.SKILL_INDEX_URI,
        name="skills_index",
        title="Index of the Agent Skills",
        description="Every generated skill: name, description and the skill:// URI of its SKILL.md (the "
        "Skills extension's discovery index).",
        mime_type="application/json",
    )
    async def skill_index_resource() -> str:
        return await guard.run(lambda: _resources().skill_index(), _read)

    @mcp.resource(
        "skill://{name}/SKILL.md",
        name="skill_md",
        title="An Agent Skill's SKILL.md",
        description="The SKILL.md of a generated skill, as named in skill://index.json.",
        mime_type="text/markdown",
    )
    async def skill_md_resource(name: str) -> str:
        return await guard.run(lambda: _resources().read_skill(name), _read)

    @mcp.resource(
        "skill://{name}/references/{file}",
        name="skill_md_reference",
        title="A reference file of an Agent Skill",
        description="A file under references/ of a generated skill, relative to its skill://{name}/SKILL.md.",
        mime_type="text/markdown",
    )
    async def skill_md_reference_resource(name: str, file: str) -> str:
        return await guard.run(lambda: _resources().read_skill(name, file), _read)


def _add_prompts(mcp: MCPServer, root: Path, guard: Guard) -> None:
    @mcp.prompt(
        name="finetune_generative",
        title="Fine-tune a generative (video/image) model",
        description="The tool sequence from a request such as 'fine-tune Wan2.1 t2v on my videos' to a "
        "followed training run: environment check, routing, install, conversion, render, validation, "
        "feature extraction, launch, status and diagnosis.",
    )
    async def finetune_generative(
        request: Annotated[
            str, Field(description="what the user wants, e.g. 'fine-tune Wan2.1 t2v on my videos'")
        ],
        dataset_dir: Annotated[
            str, Field(description="the videos/images + captions folder, in the workspace")
        ],
        weights_dir: Annotated[
            str | None, Field(description="downloaded HF weights folder, in the workspace (optional)")
        ] = None,
    ) -> str:
        raw = {"request": request, "dataset_dir": dataset_dir, "weights_dir": weights_dir}
        return await guard.run(
            lambda: (
                _prompts()
                .finetune_generative(_prompts().parse_args(_prompts().FinetuneGenerativeArgs, raw), root)
                .text
            ),
            _prompt,
        )

    @mcp.prompt(
        name="finetune_vlm",
        title="Fine-tune a vision-language model",
        description="The tool sequence from a request such as 'fine-tune Qwen2.5-VL-3B on my image-text "
        "data' to a validated job and a followed training run.",
    )
    async def finetune_vlm(
        request: Annotated[str, Field(description="what the user wants, e.g. 'fine-tune Qwen2.5-VL-3B'")],
        dataset_file: Annotated[str, Field(description="the image-text dataset file, in the workspace")],
    ) -> str:
        raw = {"request": request, "dataset_file": dataset_file}
        return await guard.run(
            lambda: (
                _prompts().finetune_vlm(_prompts().parse_args(_prompts().FinetuneVlmArgs, raw), root).text
            ),
            _prompt,
        )

    @mcp.prompt(
        name="new_model",
        title="Add your own DiT model",
        description="The tool sequence from 'I have my own architecture' to MindSpeed-MM's new-model flow written "
        "for it (scaffold_model), rendered as a job, checked and launched.",
    )
    async def new_model(
        request: Annotated[str, Field(description="what the user wants, e.g. 'add my own DiT video model'")],
        name: Annotated[str, Field(description="the new model's id: lower-case letters, digits and _")],
        checkout: Annotated[
            str | None, Field(description="their MindSpeed-MM checkout, in the workspace (optional)")
        ] = None,
        base: Annotated[str | None, Field(description="the Wan DiT to start from (default: routed)")] = None,
    ) -> str:
        raw = {"request": request, "name": name, "checkout": checkout, "base": base}
        return await guard.run(
            lambda: _prompts().new_model(_prompts().parse_args(_prompts().NewModelArgs, raw), root).text,
            _prompt,
        )

    @mcp.prompt(
        name="recover_failed_run",
        title="Recover a failed or crashed run",
        description="The tool sequence from a failed run (its run id, or a log file/folder) to the root "
        "cause, the fix and a relaunch that resumes from the last checkpoint. Pass exactly one argument.",
    )
    async def recover_failed_run(
        log_path: Annotated[
            str | None, Field(description="log file or folder of the failed run, in the workspace")
        ] = None,
        run_id: Annotated[str | None, Field(description="the run id (from `mm-agent jobs`)")] = None,
    ) -> str:
        raw = {"log_path": log_path, "run_id": run_id}
        return await guard.run(
            lambda: (
                _prompts().recover_failed_run(_prompts().parse_args(_prompts().RecoverArgs, raw), root).text
            ),
            _prompt,
        )


def _add_completion_and_logging(mcp: MCPServer, root: Path, guard: Guard) -> None:
    """`completion/complete` for the prompts' and resource templates' arguments (mm_agent.completion), and
    `logging/setLevel` for clients on the handshake protocol versions, which set a level before calling tools
    and would otherwise get "method not found". mm-agent sends no log notifications (tool progress goes as
    progress notifications), so a set level has nothing to filter; the SDK's own per-version gate keeps the
    method off the 2026-07-28 wire, where the level rides each request's _meta."""

    @mcp.completion()
    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion:
        kind, name = ("prompt", ref.name) if isinstance(ref, PromptReference) else ("resource", ref.uri)
        given = dict(context.arguments or {}) if context else {}
        done = await guard.run(
            lambda: _completion().complete(kind, name, argument.name, argument.value, given, root), _prompt
        )
        return Completion(values=[shown(v) for v in done.values], total=done.total, has_more=done.has_more)

    async def set_level(ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        return EmptyResult()

    mcp._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)


def serve(
    workspace: Path,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    allow_roots: Sequence[Path] = (),
    tool_timeout_s: float = TOOL_TIMEOUT_S,
    *,
    trust_mm_roots: Sequence[Path] = (),
    auth_token: str | None = None,
) -> None:
    if transport != "stdio" and host not in {"127.0.0.1", "localhost", "::1"}:
        raise MMAgentError(
            f"refusing to serve HTTP on {host}",
            field="host",
            fix="bind 127.0.0.1 (put an authenticating proxy in front for remote use)",
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    http = transport != "stdio"
    server = build_server(
        workspace,
        allow_roots,
        tool_timeout_s,
        trust_mm_roots=trust_mm_roots,
        auth_token=auth_token if http else None,
        remember_tools=True,
    )
    # What start-up built lives as long as the server: frozen, the collector never walks it again (calls stay
    # quick), and on again if the CLI held it off while the server was built (cli.main, for a quicker start).
    gc.freeze()
    gc.enable()
    if isinstance(server, _Server):  # and so is what the tools' load builds, when it comes later
        server.freeze_loaded = True
    log.info(
        "mm-agent %s serving %s, workspace %s, allowed roots %s, trusted checkouts %s",
        __version__,
        transport,
        workspace.resolve(),
        [str(r) for r in allow_roots] or "none",
        [str(r) for r in trust_mm_roots] or "none",
    )
    if http and auth_token is None:
        log.warning(
            "HTTP without authentication: any local user or process can call the tools as this user; "
            "pass --auth-token-file FILE (or set %s) and give the client `Authorization: Bearer <token>`",
            httpauth.TOKEN_ENV,
        )
    try:
        if transport == "stdio":
            server.run()
        else:
            server.run(transport="streamable-http", host=host, port=port)
    finally:  # the client went away (stdin closed, Ctrl-C): stop every call's work and contained process
        if isinstance(server, _Server):
            server.guard.shutdown()
