"""Side-by-side releases (issue 20, item 3), the pure parts and the host scripts: the
listing's parser, which releases a prune removes, the release names, the settings, the
plan's steps, and the fixed scripts run by the real /bin/sh on real directories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.core import remote, remote_releases
from bot.core.doctor import Answer, Outcome, judge, probes
from bot.core.plan import Step, make_plan, redeploy_steps, restart_steps
from bot.core.privilege import Privilege, run_as_of
from bot.core.releases import (
    Release,
    Releases,
    Switch,
    SwitchKind,
    Target,
    failed_releases,
    parse_releases,
    release_of,
    rollback_target,
    to_prune,
)
from bot.core.results import CommandResult
from bot.core.status import Action
from bot.core.sudoers import grants, render, rule_for
from bot.errors import InputError
from bot.settings import ServiceSettings, Settings

VENV = "/opt/venvs/vllm"


def service(tmp: Path | None = None, **overrides: object) -> ServiceSettings:
    python = f"{tmp}/venv/bin/python" if tmp is not None else f"{VENV}/bin/python"
    return ServiceSettings.model_validate(
        {"hosts": ["h"], "unit": "u", "python": python, "strategy": "side_by_side", **overrides}
    )


def test_the_listing_names_the_live_release_and_sorts_by_build_time() -> None:
    text = (
        f"live {VENV}.releases/0.16.0-aaaaaaaaaaaa\n"
        f"release 1700000200.5 {VENV}.releases/0.16.0-aaaaaaaaaaaa\n"
        f"release 1700000100.0 {VENV}.releases/0.15.1-bbbbbbbbbbbb\n"
        "release 1700000300.0 /elsewhere/x-1\n"  # not in the releases directory
        "release nonsense /opt/venvs/vllm.releases/y-2\n"
    )
    got = parse_releases(text, VENV)
    assert got == Releases(
        f"{VENV}.releases/0.16.0-aaaaaaaaaaaa",
        "0.16.0-aaaaaaaaaaaa",
        (
            Release("0.15.1-bbbbbbbbbbbb", 1700000100.0),
            Release("0.16.0-aaaaaaaaaaaa", 1700000200.5),
        ),
    )
    assert got.releases[0].version == "0.15.1"
    # A relative link is read from the link's own directory.
    rel = parse_releases("live vllm.releases/a-1\n", VENV)
    assert rel is not None and rel.live == "a-1"
    # A link elsewhere is no side-by-side layout; no listing at all is no answer.
    other = parse_releases("live /opt/venvs/vllm-old\n", VENV)
    assert other is not None and other.live is None
    assert parse_releases("", VENV) is None


def _rels(*names: str, live: str) -> Releases:
    return Releases(
        f"{VENV}.releases/{live}", live, tuple(Release(n, i) for i, n in enumerate(names))
    )


def test_a_prune_never_removes_the_live_or_the_protected_release() -> None:
    # Oldest first: a, b, c, d; d live, a the one the run switched away from.
    rels = _rels("a", "b", "c", "d", live="d")
    assert to_prune(rels, 2, ("a",)) == ("b", "c")
    assert to_prune(rels, 3, ("a",)) == ("b",)
    assert to_prune(rels, 3, (None,)) == ("a",)
    assert to_prune(rels, 10, ()) == ()
    # A rollback by hand left an older release live: it stays, with the newest other.
    assert to_prune(_rels("a", "b", "c", live="a"), 2, ()) == ("b",)


SWITCH, BACK = SwitchKind.SWITCH, SwitchKind.SWITCH_BACK


def test_a_rollback_goes_to_the_release_live_before_the_live_one_by_the_history() -> None:
    # Oldest first by build time, not by name: "z" was built first.
    rels = _rels("z", "b", "c", "d", live="b")
    history = [Switch(None, "z", 1, SWITCH), Switch("z", "b", 2, SWITCH)]
    assert rollback_target(rels, history) == Target(
        "z", "the release live before this one, switched away from by run #2"
    )
    # A failed redeploy to "c" and its switch back do not count: "b" was live before it.
    failed = [*history, Switch("b", "c", 3, SWITCH), Switch("c", "b", 3, BACK)]
    assert rollback_target(rels, failed) == rollback_target(rels, history)
    # A rollback by hand is a switch like any other: asked again, it goes back, even to a
    # newer release, and says which run left it.
    back = _rels("z", "b", "c", "d", live="z")
    target = rollback_target(back, [*history, Switch("b", "z", 4, SWITCH)])
    assert target == Target("b", "the release live before this one, switched away from by run #4")
    # A redeploy of the same pinned set switched "b" to itself: the one before still counts.
    assert rollback_target(rels, [*history, Switch("b", "b", 5, SWITCH)]) == rollback_target(
        rels, history
    )


def test_without_a_usable_history_the_newest_release_built_before_the_live_one() -> None:
    rels = _rels("a", "b", "c", "d", live="c")
    assert rollback_target(rels, []) == Target(
        "b", "no switch to the live release recorded: the newest release built before the live one"
    )
    # The release the history names is gone (pruned, removed by hand).
    gone = rollback_target(rels, [Switch("x", "c", 7, SWITCH)])
    assert gone == Target(
        "b",
        "x, live before this one until run #7, is no longer a complete release here: the "
        "newest release built before the live one",
    )
    # The history could not be read: said, and the build times decide.
    unread = rollback_target(rels, [], "the audit log cannot say: locked")
    assert isinstance(unread, Target) and unread.name == "b"
    assert unread.why.startswith("the switch history cannot be read (the audit log cannot say")
    # A release the history says failed (switched back from) is never the target, even
    # built before the live one; a later switch to it clears that.
    failed = [Switch("c", "b", 8, SWITCH), Switch("b", "c", 8, BACK)]
    assert failed_releases(failed) == {"b"}
    assert rollback_target(rels, failed) == Target(
        "a", "no switch to the live release recorded: the newest release built before the live one"
    )
    assert failed_releases([*failed, Switch("c", "b", 9, SWITCH)]) == frozenset()


def test_a_rollback_never_goes_to_a_newer_release_by_the_build_times() -> None:
    # The live release is the oldest: the newer ones (a failed one kept for a look) are no
    # target, whatever an unreadable history leaves unknown.
    rels = _rels("a", "b", "c", live="a")
    assert rollback_target(rels, []) == (
        "no switch to the live release recorded, and no other complete release was built "
        "before the live one"
    )
    assert isinstance(rollback_target(rels, [], "locked"), str)
    assert isinstance(rollback_target(_rels("a", live="a"), []), str)
    # No live release at all (the layout's refusal says which): nowhere to go.
    assert rollback_target(Releases("/elsewhere", None, ()), []) == "no live release"


def test_a_link_target_names_a_release_only_inside_the_releases_directory() -> None:
    assert release_of(f"{VENV}.releases/0.16.0-aaaaaaaaaaaa", VENV) == "0.16.0-aaaaaaaaaaaa"
    assert release_of("vllm.releases/a-1", VENV) == "a-1"  # relative to the link's directory
    assert release_of("/opt/venvs/vllm-old", VENV) is None
    assert release_of(f"{VENV}.releases/a-1/bin", VENV) is None
    assert release_of(f"{VENV}.releases/", VENV) is None


def test_a_release_is_named_by_its_version_and_its_pinned_set() -> None:
    one = remote_releases.release_name("0.16.0+cu129", "torch==2.10.0\nvllm==0.16.0+cu129\n")
    assert one.startswith("0.16.0+cu129-") and len(one.rsplit("-", 1)[1]) == 12
    assert one == remote_releases.release_name(
        "0.16.0+cu129", "torch==2.10.0\nvllm==0.16.0+cu129\n"
    )
    assert one != remote_releases.release_name(
        "0.16.0+cu129", "torch==2.10.1\nvllm==0.16.0+cu129\n"
    )
    assert remote_releases.release_name(None, "").startswith("unknown-")
    assert remote_releases.release_name("../x y", "").startswith("_x_y-")


def test_keep_releases_is_at_least_two_and_in_place_stays_the_default() -> None:
    assert ServiceSettings(hosts=["h"], unit="u", python=f"{VENV}/bin/python").strategy == (
        "in_place"
    )
    assert service().releases_dir == f"{VENV}.releases"
    with pytest.raises(ValidationError):
        service(keep_releases=1)
    with pytest.raises(ValidationError):
        service(strategy="blue_green")


def test_the_plan_builds_before_the_stop_switches_after_it_and_prunes() -> None:
    steps = [s.step for s in redeploy_steps(service(), "vllm==0.16.0", None)]
    assert Step.PREFETCH not in steps and Step.REINSTALL not in steps
    assert steps.index(Step.BUILD) < steps.index(Step.STOP) < steps.index(Step.SWITCH)
    assert steps.index(Step.SWITCH) < steps.index(Step.START)
    assert steps.index(Step.POSTCHECK) < steps.index(Step.PRUNE)
    assert {Step.BUILD, Step.SWITCH, Step.PRUNE}.isdisjoint(
        s.step for s in restart_steps(service())
    )


# ---- the scripts, run by the real shell -------------------------------------------------


def _layout(tmp: Path, *names: str, live: str) -> ServiceSettings:
    tmp.chmod(0o755)
    for n in names:
        (tmp / "venv.releases" / n / "bin").mkdir(parents=True)
        (tmp / "venv.releases" / n / remote_releases.RELEASE_MARK).write_text(n)
    (tmp / "venv.releases").chmod(0o755)
    (tmp / "venv").symlink_to(tmp / "venv.releases" / live)
    return service(tmp)


def _sh(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, input="")


def test_the_switch_replaces_the_link_and_refuses_what_is_no_release(tmp_path: Path) -> None:
    svc = _layout(tmp_path, "a-1", "b-2", live="a-1")
    r = _sh(remote_releases.switch_release(svc, "b-2"))
    assert r.returncode == 0, r.stderr
    assert os.readlink(tmp_path / "venv") == f"{tmp_path}/venv.releases/b-2"
    assert f"{remote_releases.SWITCHED_MARK} {tmp_path}/venv.releases/a-1 -> " in r.stdout
    listing = parse_releases(_sh(remote_releases.releases_list(svc)).stdout, svc.venv_dir)
    assert listing is not None and listing.live == "b-2" and listing.names() == ("a-1", "b-2")
    for name in ("../a-1", "c-3", "-x", "a b"):
        r = _sh(remote_releases.switch_release(svc, name))
        assert r.returncode != 0, name
        assert os.readlink(tmp_path / "venv") == f"{tmp_path}/venv.releases/b-2"
    # An in-place venv (a directory, no link) is never replaced.
    os.unlink(tmp_path / "venv")
    (tmp_path / "venv").mkdir()
    r = _sh(remote_releases.switch_release(svc, "a-1"))
    assert r.returncode != 0 and "not a symbolic link" in r.stderr
    assert (tmp_path / "venv").is_dir() and not (tmp_path / "venv").is_symlink()


def test_the_switch_refuses_a_directory_someone_else_owns(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: gives the venv's directory to another uid")
    svc = _layout(tmp_path, "a-1", "b-2", live="a-1")
    os.chown(tmp_path, 12345, 12345)
    r = _sh(remote_releases.switch_release(svc, "b-2"))
    assert r.returncode != 0 and "is owned by uid 12345" in r.stderr, r.stderr
    assert os.readlink(tmp_path / "venv") == f"{tmp_path}/venv.releases/a-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv", "venv.releases"]


def test_the_prune_removes_what_it_is_told_but_never_the_live_release(tmp_path: Path) -> None:
    svc = _layout(tmp_path, "a-1", "b-2", "c-3", live="b-2")
    r = _sh(remote_releases.prune_releases(svc, ["a-1", "b-2"]))
    assert r.returncode == 0, r.stderr
    assert "kept b-2: it is live" in r.stdout
    assert sorted(p.name for p in (tmp_path / "venv.releases").iterdir()) == ["b-2", "c-3"]
    r = _sh(remote_releases.prune_releases(svc, ["c-3", ".."]))
    assert r.returncode != 0  # one bad name: nothing removed
    assert (tmp_path / "venv.releases" / "c-3").is_dir() and tmp_path.is_dir()


def _fake_uv(tmp: Path, fail: bool = False) -> Path:
    uv = tmp / "uv"
    uv.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = venv ]; then for a; do v=$a; done; mkdir -p "$v/bin"; '
        'printf "#!/bin/sh\\necho gate-ran\\n" > "$v/bin/python"; chmod +x "$v/bin/python"; '
        "exit 0; fi\n" + ("exit 5\n" if fail else "cat > /dev/null\n")
    )
    uv.chmod(0o755)
    return uv


def test_the_build_makes_a_complete_release_and_cleans_up_a_failed_one(tmp_path: Path) -> None:
    _layout(tmp_path, "a-1", live="a-1")
    svc = service(tmp_path, uv=str(_fake_uv(tmp_path)))
    r = _sh(remote_releases.build_release(svc, "b-2", None))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [remote_releases.BUILT_MARK, "gate-ran"]
    assert (
        tmp_path / "venv.releases" / "b-2" / remote_releases.RELEASE_MARK
    ).read_text() == "b-2\n"
    again = _sh(remote_releases.build_release(svc, "b-2", None))
    assert again.stdout.splitlines()[0] == remote_releases.REUSED_MARK
    broken = service(tmp_path, uv=str(_fake_uv(tmp_path, fail=True)))
    r = _sh(remote_releases.build_release(broken, "c-3", None))
    assert r.returncode == 5 and remote_releases.BUILT_MARK not in r.stdout
    assert not (tmp_path / "venv.releases" / "c-3").exists()
    # A directory of that name that is no complete release is never built over.
    (tmp_path / "venv.releases" / "d-4").mkdir()
    r = _sh(remote_releases.build_release(svc, "d-4", None))
    assert r.returncode == 1 and "not a complete release" in r.stderr


def test_every_release_command_a_sudo_host_runs_has_a_rule() -> None:
    svc = service(
        venv_user="vllm",
        uv="/usr/local/bin/uv",
        systemctl="/usr/bin/systemctl",
        journalctl="/usr/bin/journalctl",
    )
    name = remote_releases.release_name("0.16.0", "vllm==0.16.0\n")
    for argv in (
        remote_releases.releases_list(svc),
        remote_releases.build_release(svc, name, None),
        remote_releases.build_release(svc, name, "https://user:tok@example.com/simple"),
        remote_releases.switch_release(svc, name),
        remote_releases.prune_releases(svc, (name,)),
        remote_releases.prune_releases(svc, (name, "0.15.1-0123456789ab")),
    ):
        # An install from an index keeps its stdin wrapper outside sudo (bot.core.become).
        core = (
            argv[len(remote.INDEX_FROM_STDIN) :]
            if argv[:3] == remote.INDEX_FROM_STDIN[:3]
            else argv
        )
        assert rule_for(core, svc) is not None, argv
        assert run_as_of(argv) == Privilege.VENV_OWNER
    for g in grants(svc):
        assert g.matches(g.sample), g.line()
        # Real sudo matched no rule for a command line with a backslash in it
        # (tests/test_nonroot.py found it): the release scripts hold none.
        assert "\\" not in " ".join(g.sample) or g.sample[2] not in (
            remote_releases.RELEASES_LIST,
            remote_releases.BUILD_RELEASE,
            remote_releases.SWITCH_RELEASE,
            remote_releases.PRUNE_RELEASES,
        ), g.line()
    text = render(
        Settings(
            hosts={
                "h": {
                    "address": "10.0.0.5",
                    "user": "chatops",
                    "become": "sudo",
                    "known_hosts": "/dev/null",
                }
            },
            services={"svc": svc.model_dump()},
            maintenance={"systemctl": "/usr/bin/systemctl", "nvidia_smi": "/usr/bin/nvidia-smi"},
            db_path=Path("/nonexistent/audit.db"),
        ),
        "chatops",
    )
    assert "switch the venv's link to a release" in text
    # An in-place service has no release rules.
    plain = service(venv_user="vllm", uv="/usr/local/bin/uv", strategy="in_place")
    assert rule_for(remote_releases.switch_release(plain, name), plain) is None


def test_doctor_checks_a_side_by_side_layout() -> None:
    svc = service()
    s = Settings(
        hosts={
            "h": {
                "address": "10.0.0.5",
                "user": "chatops",
                "known_hosts": "/dev/null",
            }
        },
        services={"svc": svc.model_dump()},
        db_path=Path("/nonexistent/audit.db"),
    )
    probe = next(p for p in probes(s, ["h"]) if p.name == "releases")
    assert probe.commands == ((remote_releases.releases_list(svc), Privilege.VENV_OWNER),)

    def answer(code: int, out: str, err: str = "") -> Answer:
        return Answer(results=(CommandResult(probe.commands[0][0], code, out, err, 0.1),))

    good = f"live {VENV}.releases/a-1\nrelease 1700000000.0 {VENV}.releases/a-1\n"
    ok = judge(probe, answer(0, good), s)
    assert ok.outcome == Outcome.OK and f"{VENV} -> {VENV}.releases/a-1" in ok.detail
    no_link = judge(probe, answer(3, "", f"{VENV} is not a symbolic link\n"), s)
    assert no_link.outcome == Outcome.FAIL and "not a side-by-side layout" in no_link.detail
    assert "converting an in-place venv" in no_link.fix
    elsewhere = judge(probe, answer(0, "live /opt/venvs/vllm-old\n"), s)
    assert elsewhere.outcome == Outcome.FAIL and "not at a release" in elsewhere.detail
    incomplete = judge(probe, answer(0, f"live {VENV}.releases/a-1\n"), s)
    assert incomplete.outcome == Outcome.FAIL and "not a complete release" in incomplete.detail
    # An in-place service has no such check.
    plain = s.model_copy(
        update={"services": {"svc": svc.model_copy(update={"strategy": "in_place"})}}
    )
    assert "releases" not in [p.name for p in probes(plain, ["h"])]


def test_a_rollback_by_hand_is_a_restart_with_the_switch_before_the_start() -> None:
    s = Settings(
        hosts={"h": {"address": "10.0.0.5", "user": "chatops", "known_hosts": "/dev/null"}},
        services={
            "svc": service().model_dump(),
            "plain": {**service().model_dump(), "strategy": "in_place"},
        },
        db_path=Path("/nonexistent/audit.db"),
    )
    plan = make_plan(s, Action.ROLLBACK, "svc")
    steps = [p.step for p in plan.steps]
    assert steps.index(Step.DRAIN) < steps.index(Step.SWITCH) < steps.index(Step.START)
    assert Step.BUILD not in steps and Step.REINSTALL not in steps
    with pytest.raises(InputError, match="plain is in_place"):
        make_plan(s, Action.ROLLBACK, "plain")
