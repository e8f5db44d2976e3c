"""armid as an installed command: it runs from any working directory (the chain's children get absolute
paths, shipped data comes through the package), says its version, gives -o one meaning, identifies the
MCAP files it records, names the extra to install when one is missing, and says when numba compiles.

The commands run as subprocesses from a temporary directory, never from the repository root."""
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from armid import cli
from armid.jit import NOTICE, CompileNotice

ROOT = Path(__file__).resolve().parents[1]


def armid(*args: str, cwd: Path, timeout: float = 300.0, env: dict | None = None) -> subprocess.CompletedProcess:
    """`armid ARGS` (the console script installed beside this interpreter, else `python -m armid.cli`)."""
    script = Path(sys.executable).with_name("armid")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "armid.cli"]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env}, stdin=subprocess.DEVNULL)


def test_armid_version_prints_the_installed_distributions_version(tmp_path):
    done = armid("--version", cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"armid {metadata.version('armid')}"


def test_model_show_finds_the_shipped_model_from_another_directory(tmp_path):
    done = armid("model", "show", "generic6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("model generic6: 6 joints, from ")
    assert "58 base parameters" in done.stdout


def test_the_demo_runs_from_another_directory_into_a_relative_output_folder(tmp_path):
    """The chain's children used to run in the source tree with paths relative to the caller's directory:
    step 3 could not find processes/driver.toml anywhere but in the repository root."""
    done = armid("demo", "-o", "out", "--periods", "0.25", cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "out"
    assert (out / "report.html").is_file() and (out / "result.json").is_file()
    assert (out / "processes" / "driver.toml").is_file()
    assert f"open {out / 'report.html'}" in done.stdout
    assert not (ROOT / "out").exists()


def test_the_chains_children_run_the_parents_armid_not_a_folder_named_armid_in_the_working_directory(
        tmp_path, monkeypatch):
    from armid import chain

    decoy = tmp_path / "armid"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    (decoy / "cli.py").write_text("print('the decoy ran')\n")
    monkeypatch.chdir(tmp_path)
    out = chain.run_tool("version", ["--version"], Path("logs"), "run armid --version", timeout_s=120)
    assert out.strip() == f"armid {metadata.version('armid')}"
    assert (tmp_path / "logs" / "version.out").is_file()


# -- options --------------------------------------------------------------------------------------------
def _subparsers(parser, path=()):
    """(command path, parser) of every subcommand, depth first."""
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subparsers(sub, (*path, name))


def test_every_short_option_means_the_same_long_option_in_every_subcommand():
    meanings: dict[str, set[str]] = {}
    for _, sub in _subparsers(cli._parser()):
        for action in sub._actions:
            shorts = [o for o in action.option_strings if len(o) == 2 and o != "-h"]
            longs = [o for o in action.option_strings if o.startswith("--")]
            for s in shorts:
                meanings.setdefault(s, set()).add(longs[0] if longs else "")
    assert meanings["-o"] == {"--output"}
    assert all(len(m) == 1 for m in meanings.values()), meanings


@pytest.mark.parametrize("command", [["demo"], ["identify", "run.csv", "--model", "generic6"],
                                     ["payload", "plan", "--method", "static", "--model", "generic6"],
                                     ["payload", "identify", "--method", "static", "--loaded", "a.csv",
                                      "--unloaded", "b.csv", "--model", "generic6"],
                                     ["record", "convert", "run.mcap"],
                                     ["excite", "design", "--model", "generic6"]])
@pytest.mark.parametrize("spelling", ["-o", "--output", "--out"])
def test_output_paths_take_o_output_and_the_old_out(command, spelling):
    if spelling == "--out" and command[0] not in ("demo", "identify", "payload"):
        pytest.skip("--out was never a spelling of this command")
    args = cli._parser().parse_args([*command, spelling, "somewhere"])
    assert args.output == "somewhere"


def test_sims_transport_option_is_option_and_no_longer_o(capsys):
    args = cli._parser().parse_args(["sim", "--transport", "serial", "--option", "port=5020", "--option", "x=1"])
    assert args.option == ["port=5020", "x=1"]
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["sim", "--transport", "serial", "-o", "port=5020"])


# -- identify on MCAP --------------------------------------------------------------------------------------
def _write_mcap(path: Path, seconds: float = 4.0) -> None:
    """A recording of seed 000's excitation on the simulated generic6, written as `armid record` writes one."""
    from driver.recorder import McapStateWriter
    from firmware_bridge import stream
    from ident.fit import excitation
    from ident.model import load_model
    from sim.recording import simulate

    model = load_model("generic6")
    rec = simulate(model, excitation.preset("seed000"), seconds, seed=4)
    qd = np.gradient(rec.q, rec.t, axis=0)
    writer = McapStateWriter(path, joint_names=list(model.joint_names), metadata={"effort_delay_s": repr(rec.effort_delay)})
    m = stream.StateMessage(model.n)
    for k in range(len(rec.t)):
        m.q[:], m.qd[:], m.torque[:] = rec.q[k], qd[k], rec.tau[k]
        m.current[:] = 0.0
        ns = int(round(rec.t[k] * 1e9))
        m.set_header(k, 0, ns, 1_700_000_000_000_000_000 + ns)
        writer.write_state(bytes(m.buffer), model.n, k, 1_700_000_000_000_000_000 + ns)
    writer.close({"messages": str(len(rec.t))})


def test_identify_reads_the_mcap_of_armid_record_as_record_convert_converts_it(tmp_path):
    run = tmp_path / "run.mcap"
    _write_mcap(run)
    converted = armid("record", "convert", str(run), "-o", "run.npz", cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    results = {}
    for name, data in (("mcap", "run.mcap"), ("npz", "run.npz")):
        done = armid("identify", data, "--model", "generic6", "-o", name, "--quiet", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        results[name] = json.loads((tmp_path / name / "result.json").read_text())
    assert results["mcap"]["data"]["samples"] == results["npz"]["data"]["samples"] > 1000
    assert results["mcap"]["data"]["effort_delay_s"] == results["npz"]["data"]["effort_delay_s"] > 0
    assert results["mcap"]["base_parameters"] == results["npz"]["base_parameters"]


# -- the ident extra -----------------------------------------------------------------------------------
BLOCK = textwrap.dedent("""
    import sys

    class Block:      # what a venv without the 'ident' extra looks like
        BLOCKED = ("cvxpy", "clarabel", "matplotlib")

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in self.BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
""")


def _python(code: str, cwd: Path, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_the_daemons_modules_import_without_the_ident_extra(tmp_path):
    done = _python("""
        import driver.daemon, sim, driver.transports.serial_link, driver.transports.can, driver.transports.gateway
        import driver.recorder, firmware_bridge.recording, armid.chain
        from armid import cli
        cli._parser()
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in Block.BLOCKED)
        print("loaded:", loaded)
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "loaded: []"


@pytest.mark.parametrize("command", [["identify", "run.csv", "--model", "generic6", "-o", "out"],
                                     ["demo", "--periods", "0.25"],
                                     ["payload", "identify", "--method", "static", "--loaded", "a.csv", "--unloaded",
                                      "b.csv", "--model", "generic6", "-o", "out"],
                                     ["calibrate", "identify", "meas.csv", "--model", "generic6", "-o", "out"]])
def test_a_missing_extra_is_one_line_naming_the_extra_and_exit_status_2(tmp_path, command):
    done = _python(f"""
        from armid import cli
        sys.exit(cli.main({command!r}))
    """, tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert ": matplotlib is not installed; install the 'ident' extra" in lines[0]
    assert "pip install 'armid[ident]'" in lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "armid-demo").exists()   # said before any work


def test_a_missing_solver_in_the_library_raises_the_extras_error(monkeypatch):
    from ident.errors import InputError
    from ident.extras import MissingExtra, require

    monkeypatch.setitem(sys.modules, "cvxpy", None)
    with pytest.raises(MissingExtra, match=r"^the fit: cvxpy is not installed; install the 'ident' extra"):
        require("cvxpy", "the fit")
    assert issubclass(MissingExtra, InputError)


# -- compiling --------------------------------------------------------------------------------------------
def test_the_compile_notice_comes_once_and_names_each_kernel_compiled_but_not_one_loaded():
    import io

    from numba import njit
    from numba.core import event

    @njit(cache=False)
    def twice(x):
        return 2 * x

    out = io.StringIO()
    listener = CompileNotice(out, ticker_s=0)
    event.Listener.register(CompileNotice)
    with event.install_listener("numba:compile", listener):
        twice(1)
        twice(2)            # compiled already: nothing
        twice(1.5)          # a new specialisation: compiled
    lines = out.getvalue().splitlines()
    assert lines[0] == NOTICE
    name = f"{__name__}.{twice.py_func.__qualname__}"
    assert [line.split(" in ")[0] for line in lines[1:]] == [f"armid: compiling {name} ...", f"armid: compiled {name}",
                                                             f"armid: compiling {name} ...", f"armid: compiled {name}"]
    assert [k for k, _ in listener.compiled] == [name, name]


def test_on_a_fresh_cache_warmup_compiles_the_regressor_once_and_then_finds_it_cached(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    probe = ("from armid.jit import cached_signatures; from ident import kernels; "
             "print(cached_signatures(kernels.regressor))")

    def cached() -> str:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env}, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert cached() == "0"
    first = armid("warmup", "--part", "identify", cwd=tmp_path, timeout=900, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert NOTICE in first.stderr and "armid: compiled ident.model.kernels.regressor in " in first.stderr
    assert cached() == "1"
    again = armid("warmup", "--part", "identify", cwd=tmp_path, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "compiling" not in again.stderr and "armid warmup: identify: 0 kernel(s) compiled" in again.stderr
