"""A plugin project outside the checkout, kvspec installed into its own virtualenv as README says."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tests.typing.checkers.diagnostics import parse_mypy, parse_pyright
from tests.typing.checkers.pins import ROOT, TYPING
from tests.typing.checkers.runners import MYPY_OUTPUT, Environment
from tests.typing.checkers.verdicts import judge_accept, judge_reject

#: How README tells a plugin author to install kvspec: as a package (pip builds a wheel), or editable in the
#: mode whose path a checker follows (setuptools' default editable mode is an import hook no checker sees).
INSTALL_FORMS: dict[str, tuple[str, ...]] = {
    "package": (str(ROOT),),
    "editable": ("-e", str(ROOT), "--config-settings", "editable_mode=compat"),
}
#: How a report names each form.
FORM_LABELS = {
    "package": "kvspec installed as a package",
    "editable": "kvspec installed editable (compat mode)",
    "hook": "kvspec installed editable (import hook)",
}
OUTSIDE_CHECKERS = ("mypy", "pyright")
#: The negative control: setuptools' default editable install (an import hook), which no checker follows,
#: must make the outside project fail (``--control``), or the check above proves nothing.
HOOK_FORM: tuple[str, ...] = ("-e", str(ROOT))


def _site_packages(python: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def outside_project(env: Environment, form: str, checkers: Sequence[str] = OUTSIDE_CHECKERS) -> list[str]:
    """A plugin project in a temporary folder outside the checkout, kvspec installed into its own virtualenv
    as README says (``form``: "package" or "editable"; its dependencies are taken from ``env.python``'s
    packages rather than downloaded again), then each checker run from that folder, strict: README's plugin
    must be clean and the audit's mistakes caught as marked, which proves the checker resolved kvspec (a
    kvspec it cannot see is ``Any``, and the mistakes pass). The problems found (empty: as expected)."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvspec-plugin-") as tmp:
        project = Path(tmp) / "acme"
        (project / "acme").mkdir(parents=True)
        (project / "acme" / "__init__.py").write_text("")
        (project / "acme" / "plugin.py").write_text((TYPING / "accept_readme_example.py").read_text())
        mistakes = TYPING / "reject" / "reject_plugin_audit.py"
        (project / "acme" / "mistakes.py").write_text(mistakes.read_text())
        (project / "mypy.ini").write_text("[mypy]\nstrict = True\n")
        (project / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}) + "\n")
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        # torch and kvspec's other requirements come from the checked environment (no second download).
        Path(_site_packages(python), "kvspec_test_requirements.pth").write_text(
            _site_packages(env.python) + "\n"
        )
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                *(HOOK_FORM if form == "hook" else INSTALL_FORMS[form]),
            ],
            check=True,
            cwd=tmp,
            capture_output=True,
        )
        files = ["acme/plugin.py", "acme/mistakes.py"]
        for checker in checkers:
            if checker == "mypy":
                mypy = [env.tools.get("mypy", sys.executable), "-m", "mypy", "--python-executable", python]
                argv = [*mypy, "--cache-dir", str(Path(tmp) / "mypy-cache"), *MYPY_OUTPUT, *files]
                out = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=1800)
                diags = parse_mypy(out.stdout)
            elif checker == "pyright":
                argv = [env.tool("pyright", "pyright"), "--pythonpath", python, "--outputjson", *files]
                out = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=1800)
                diags = [replace(d, path=_inside(d.path, project)) for d in parse_pyright(out.stdout)]
            else:
                raise ValueError(f"the outside project is checked by {OUTSIDE_CHECKERS}, not {checker!r}")
            where = f"outside project, {FORM_LABELS[form]}"
            plugin = [d for d in diags if d.path == "acme/plugin.py"]
            problems += [f"{p} ({where})" for p in judge_accept("acme/plugin.py", checker, plugin).problems]
            caught = judge_reject(
                mistakes,
                checker,
                [d for d in diags if d.path == "acme/mistakes.py"],
                shown="acme/mistakes.py",
            )
            problems += [f"{p} ({where})" for p in caught.problems]
            problems += [
                f"{checker}: {d.path}:{d.line}: [{d.code}] {d.message} ({where})"
                for d in diags
                if d.severity == "error" and d.path not in files
            ]
    return problems


def _inside(path: str, project: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(project.resolve()))
    except ValueError:
        return path
