"""`prl-actors up`: check the config, the task and the model, then run every actor as a local process
(or as docker compose services). Imports only typer at module level; the launcher, torch and the
model come after the first console line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from prl_actors.cli.common import ConfigOpt, SetOpt, _config, _overrides, fail


def up(
    config: ConfigOpt = None,
    workers: Annotated[
        int | None, typer.Option(help="Inference workers to start (default: the config's run.workers, 2).", min=0)
    ] = None,
    epochs: Annotated[
        int | None,
        typer.Option(
            help="Iteration-epochs to train (default: the config's run.epochs, 5). An epoch generates "
            "coordinator.groups_per_epoch groups and publishes one new weight version: one optimizer step, "
            "or trainer.num_minibatches x trainer.num_iterations steps (DAPO's recipe: 16).",
            min=1,
        ),
    ] = None,
    mode: Annotated[
        str | None,  # checked by the config (run.mode), whose error names the field
        typer.Option(
            metavar="periodic|sync|bounded",
            help="periodic: train groups as they arrive; sync: wait for the whole batch (the baseline); "
            "bounded: generate epoch e+1 while e trains, with run.max_staleness (default: the config's "
            "run.mode, periodic).",
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option("--run-dir", help="Logs, metrics, checkpoints go here (default: the config's run.run_dir)."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in --run-dir from its last intact checkpoint, with its own "
            "RUN_DIR/config.yaml. --config/--set/--epochs/--workers may change only what is safe "
            "(epochs, workers, ports, timeouts, threads, devices); anything else is refused.",
        ),
    ] = False,
    compose: Annotated[bool, typer.Option("--compose", help="Run the services with docker compose instead.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Resolve and check the config and the task's data, print the resolved config, start nothing.",
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Run every actor as a local process until the run completes.

    With --compose: as docker compose services instead (default config: configs/compose.yaml).

    Ctrl-C, SIGTERM or SIGHUP stop every actor (grace period, then SIGKILL).

    A crashed core actor restarts the core from the last checkpoint (run.max_restarts).

    Exit codes: 0 every epoch done; 1 an actor failed (its error is printed);

    2 a bad command line or config; 3 stopped before the last epoch (--resume continues);

    128+N stopped by signal N.
    """
    source = f"the run in {run_dir}" if resume and run_dir else (config or "the built-in defaults")
    typer.echo(f"up: {'resuming' if resume else 'starting'} from {source} ...", err=True)  # before any heavy import
    if compose and config is None:
        from prl_actors.launch.compose import DEFAULT_CONFIG

        config = DEFAULT_CONFIG
    flags = {
        "run.workers": workers,
        "run.epochs": epochs,
        "run.mode": mode,
        "run.run_dir": str(run_dir) if run_dir else None,
    }
    cfg = _resume_config(config, set_, flags) if resume else _config(config, set_, flags)
    if dry_run:
        _dry_run(cfg)
    if compose:
        from prl_actors.launch.compose import compose_up

        raise typer.Exit(compose_up(cfg))
    from prl_actors.launch.proctitle import set_title

    set_title("up", cfg.run.name)  # `ps`: prl-actors up (run NAME); each actor titles itself so too
    from prl_actors.records.rundir import RunDir, RunDirBusy

    rd = RunDir(cfg.run.run_dir)
    if cfg.env is not None:
        _up_env(cfg, rd)
    if rd.has_run() and not resume:
        fail(f"run dir {rd.root} already holds a run; use another --run-dir, or --resume to continue it")
    try:
        with rd.lock():
            code = _launch(cfg, rd)
    except RunDirBusy as exc:
        fail(str(exc))
    raise typer.Exit(code)


def _dry_run(cfg: Any) -> None:
    """`up --dry-run`: the resolved config (every default filled in) and the task's check; exit 0."""
    if cfg.env is None:
        _check_task(cfg)
        what = f"{cfg.run.workers} workers for {cfg.run.epochs} epochs"
    else:
        what = f"a learner and {cfg.env.actors} env actors on {cfg.env.env_id}"
    typer.echo(cfg.dump().rstrip())
    typer.echo(f"dry run: the config checks out; `up` would start {what} in {cfg.run.run_dir}", err=True)
    raise typer.Exit(0)


def _resume_config(config: Path | None, sets: list[str] | None, flags: dict[str, Any]):  # type: ignore[no-untyped-def]
    """The run's own RUN_DIR/config.yaml, changed only where --config/--set/flags change safe fields."""
    from prl_actors.config import RunSection, check_resume, load_config
    from prl_actors.records.rundir import RunDir
    from prl_actors.sections import ConfigError

    try:
        overrides = _overrides(sets, flags)
        default_dir = load_config(config).run.run_dir if config else RunSection().run_dir
        rd = RunDir(overrides.setdefault("run.run_dir", default_dir))
        overrides["run.resume"] = True
        if not rd.config.is_file():
            fail(f"nothing to resume in {rd.root}: no config.yaml (start a run there with `prl-actors up`)")
        asked = load_config(config or rd.config, overrides)
        check_resume(load_config(rd.config), asked)
    except ConfigError as exc:
        fail(str(exc))
    if rd.metrics.exists() and not rd.has_checkpoint():
        fail(f"nothing to resume in {rd.root}: it has trained epochs but no checkpoint (trainer.checkpoint_every 0?)")
    _check_epochs_to_go(rd, asked.run.epochs)
    return asked


def _check_epochs_to_go(rd: Any, epochs: int) -> None:
    """Before any actor starts: a resume with nothing to train, or fewer epochs than are done, is
    refused with one line; else say which checkpoint it resumes from."""
    from prl_actors.protocol.versions import epoch_for
    from prl_actors.records.rundir import CheckpointError

    try:
        ckpt = rd.latest_checkpoint()  # the one the trainer will load (damaged newer ones are skipped)
    except CheckpointError:
        return  # none is intact: the trainer fails at its start with the cause, as any actor would
    if ckpt is None:
        return
    version = int(ckpt.name[1:])
    done = epoch_for(version)
    if epochs < done:
        fail(f"--epochs {epochs} is below the {done} epochs {rd.root} has done (v{version}); pass --epochs > {done}")
    if epochs == done:
        typer.echo(
            f"nothing to do: the run in {rd.root} is finished, {done} of {epochs} epochs done (v{version}); "
            f"to train more: prl-actors up --resume --run-dir {rd.root} --epochs N (N > {done})",
            err=True,
        )
        raise typer.Exit(0)
    typer.echo(f"resumed from v{version}: {done} of {epochs} epochs done, {epochs - done} to train", err=True)


def _launch(cfg: Any, rd: Any) -> int:
    """Check the task, make the keys, prepare the model, pick or check the ports, write
    RUN_DIR/config.yaml, run the launcher (its actors forked by a fork server that starts first:
    run.fork_server)."""
    from prl_actors.launch.zygote import Zygote

    zygote = Zygote(cfg.run.name) if cfg.run.fork_server else None  # it imports torch & co. while the checks run
    try:
        return _launch_with(cfg, rd, zygote)
    finally:
        if zygote is not None:
            zygote.close()


def _launch_with(cfg: Any, rd: Any, zygote: Any) -> int:
    from prl_actors.launch.up import Launcher, RunFailed, check_ports, pick_ports, summary
    from prl_actors.records.rundir import register_run, unregister_run

    typer.echo("checking the task and its prompts ...", err=True)
    t_task = time.monotonic()
    task = _check_task(cfg)
    typer.echo(
        f"task {task.name or cfg.task.name}: {len(task.items)} prompts ({time.monotonic() - t_task:.1f}s)", err=True
    )
    _run_keys(cfg)
    t0 = time.monotonic()
    _prepare_model(cfg)  # nothing to prepare for the sim engine
    try:  # after the model (a first build takes minutes): another run cannot take the ports meanwhile
        pick_ports(cfg)
        check_ports(cfg)
    except RunFailed as exc:
        fail(str(exc), code=1)
    rd.config.write_text(cfg.dump())  # the resolved config, chosen ports included (status/scale/stop read it)
    register_run(rd.root)  # status/scale/stop/health find this run without --config while it runs
    typer.echo(
        f"up: {cfg.run.workers} workers, {cfg.run.epochs} epochs, mode {cfg.run.mode}, "
        f"B={cfg.coordinator.groups_per_epoch} G={cfg.worker.group_size}, engine {cfg.worker.engine}, "
        f"transport {cfg.transport.kind} (auth {cfg.transport.auth if cfg.transport.kind != 'inproc' else 'none'}), "
        f"coordinator {cfg.address('coordinator')}, run dir {rd.root}",
        err=True,
    )
    try:
        code = Launcher(cfg, rd.config, progress=sys.stderr.isatty(), zygote=zygote).run()
    except RunFailed as exc:
        fail(str(exc), code=1)
    finally:
        unregister_run(rd.root)  # a finished run is no longer one `status` & co. pick
    if code == 0:
        typer.echo(summary(rd.root, time.monotonic() - t0), err=True)
    return code


def _run_keys(cfg: Any) -> None:
    """The run's keys (RUN_DIR/keys, kept on --resume): every actor started here reads its own there."""
    from prl_actors.transport.auth import create_keys, run_key_names

    if cfg.authenticated():
        create_keys(cfg.keys_path(), run_key_names())
    elif cfg.transport.kind != "inproc":
        typer.secho(
            "warning: transport.auth is none: any process on this host can act as any actor (docs/SECURITY.md)",
            fg=typer.colors.YELLOW,
            err=True,
        )


def _check_task(cfg: Any) -> Any:
    """Bad rows, templates, a resume on changed data: refused before any actor starts. The task."""
    from prl_actors.launch import build
    from prl_actors.sections import ConfigError

    try:
        task = build.task(cfg)
        if cfg.eval.every_epochs > 0:  # a bad eval.prompts_file is refused here too, not in the coordinator
            from prl_actors.coordinator.evaluation import eval_items

            if not eval_items(cfg.eval, cfg.task, cfg.model.path, cfg.run.seed, task.items):
                raise ConfigError("eval: no eval prompts (eval.prompts_file is empty)")
    except ConfigError as exc:
        fail(str(exc))
    if task.note:
        typer.secho(f"warning: {task.note}", fg=typer.colors.YELLOW, err=True)
    return task


def _up_env(cfg: Any, rd: Any) -> None:
    """`up` for a classic-RL config (an `env` section): a learner and env actor processes (docs/ENVS.md)."""
    from prl_actors.records.rundir import RunDirBusy

    if rd.has_run():
        fail(f"run dir {rd.root} already holds a run; use another --run-dir")
    try:
        with rd.lock():  # as GRPO's `up`: a second `up` on this run dir fails at once
            code = _launch_env(cfg, rd)
    except RunDirBusy as exc:
        fail(str(exc))
    raise typer.Exit(code)


def _launch_env(cfg: Any, rd: Any) -> int:
    """Pick or check the ports, write RUN_DIR/config.yaml and the keys, run the env runtime."""
    from prl_actors.launch.classic import EnvRun
    from prl_actors.launch.up import RunFailed, check_ports, pick_ports

    try:
        pick_ports(cfg)
        check_ports(cfg)
    except RunFailed as exc:
        fail(str(exc), code=1)
    rd.root.mkdir(parents=True, exist_ok=True)
    rd.config.write_text(cfg.dump())
    _run_keys(cfg)
    env = cfg.env
    typer.echo(
        f"up: {env.env_id}, mode {env.mode}, {env.actors} env actors, {env.num_envs} envs, "
        f"sync_kl_threshold {env.sync_kl_threshold}, transport {cfg.transport.kind} (auth {cfg.transport.auth}), "
        f"run dir {rd.root}",
        err=True,
    )
    t0 = time.monotonic()
    code = EnvRun(cfg, rd.config).run()
    typer.echo(f"wall {time.monotonic() - t0:.1f}s; metrics in {rd.metrics}", err=True)
    return code


def _prepare_model(cfg: Any) -> None:
    """Build (or check) the model every torch actor loads, once, before any actor starts, with a
    progress display; a bad model is one error line."""
    if cfg.worker.engine == "sim":
        return
    from prl_actors.launch import build
    from prl_actors.runtime.core import one_line
    from prl_actors.sections import ConfigError

    typer.echo(f"preparing model ({cfg.model.path or 'built-in tiny LM'}) ...", err=True)
    t0 = time.monotonic()
    try:
        directory = build.ready_model_dir(cfg)  # without torch: built or cached already
        if directory is None:  # a build: torch, transformers and the warm start, with a progress display
            from prl_actors.cli.progress import warm_start_progress

            with warm_start_progress("warm start of the built-in model") as on_step:
                directory = build.model_dir(cfg, on_step=on_step)
        if cfg.trainer.lora is not None:  # refused before any actor starts
            from prl_actors.training.lora import check_targets

            check_targets(cfg.trainer.lora, directory)
        if cfg.run.workers:  # the workers `up` starts here need a working engine here
            build.check_engine(cfg, directory, cfg.run.workers)
    except ConfigError as exc:
        fail(str(exc))
    except Exception as exc:  # a broken model directory is the user's to fix: one line, no traceback
        fail(f"cannot prepare the model: {one_line(exc)}", code=1)
    typer.echo(f"model ready in {time.monotonic() - t0:.1f}s", err=True)
