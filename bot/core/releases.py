"""Side-by-side releases (issue 20, item 3), the pure parts: what the host's listing
(``bot.core.remote_releases.RELEASES_LIST``) says, which release is live, and which ones a prune
removes. The venv's path is a symlink into ``<venv>.releases``; each release a venv of
its own, named ``<version>-<sha>`` (``bot.core.remote_releases.release_name``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import PurePosixPath

from bot.core import remote_releases
from bot.settings import ServiceSettings


@dataclass(frozen=True, slots=True)
class Release:
    name: str
    built: float  # when its build ended (seconds since the epoch)

    @property
    def version(self) -> str:
        """The version part of the name (``0.16.0`` of ``0.16.0-0123456789ab``)."""
        head, sep, _ = self.name.rpartition("-")
        return head if sep else self.name


@dataclass(frozen=True, slots=True)
class Releases:
    """The listing: the link's target as it reads (``target``), the live release's name
    when that target is a release of the releases directory (None: the layout is not
    side-by-side, or the link points elsewhere), and every complete release, oldest
    first."""

    target: str
    live: str | None
    releases: tuple[Release, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.releases)

    def previous(self) -> str | None:
        """The newest release before the live one: where a rollback by hand goes."""
        older = [r for r in self.releases if r.name != self.live]
        return older[-1].name if older else None


def parse_releases(text: str, venv_dir: str) -> Releases | None:
    """The listing's ``live <target>`` and ``release <mtime> <dir>`` lines; None without
    the ``live`` line (the script failed before it)."""
    rels = PurePosixPath(f"{venv_dir}.releases")
    target: str | None = None
    found: list[Release] = []
    for line in text.splitlines():
        if line.startswith(remote_releases.LIVE_PREFIX) and target is None:
            target = line[len(remote_releases.LIVE_PREFIX) :]
        elif line.startswith(remote_releases.RELEASE_PREFIX):
            stamp, _, where = line[len(remote_releases.RELEASE_PREFIX) :].partition(" ")
            path = PurePosixPath(where)
            try:
                built = float(stamp)
            except ValueError:
                continue
            if path.parent == rels and path.name:
                found.append(Release(path.name, built))
    if target is None:
        return None
    # A relative link is relative to the link's own directory.
    resolved = PurePosixPath(venv_dir).parent / target
    live = resolved.name if resolved.parent == rels and resolved.name else None
    found.sort(key=lambda r: (r.built, r.name))
    return Releases(target, live, tuple(found))


def layout_refusal(svc: ServiceSettings, layout: Releases | None, why: str) -> str | None:
    """Why ``venv_dir`` is not a side-by-side layout (None: it is)."""
    convert = "convert it first (README: side-by-side releases)"
    if layout is None:
        return f"{svc.venv_dir} is not a side-by-side layout ({why}); {convert}"
    if layout.live is None:
        return (
            f"{svc.venv_dir} points at {layout.target}, not at a release in "
            f"{svc.releases_dir}; {convert}"
        )
    if layout.live not in layout.names():
        return (
            f"{svc.venv_dir} points at {layout.target}, which is not a complete release "
            f"(no {remote_releases.RELEASE_MARK} in it); {convert}"
        )
    return None


def to_prune(releases: Releases, keep: int, protect: tuple[str | None, ...]) -> tuple[str, ...]:
    """The releases a prune removes so that ``keep`` are left: never the live one nor any
    in ``protect`` (the one this run switched away from, a rollback's way back), then
    the newest others until ``keep`` are kept."""
    kept = {n for n in (releases.live, *protect) if n is not None}
    for r in reversed(releases.releases):
        if len(kept) >= keep:
            break
        kept.add(r.name)
    return tuple(r.name for r in releases.releases if r.name not in kept)


def render_releases(host: str, layout: Releases | None, error: str | None) -> str:
    """One host's releases as ``python -m bot releases`` prints them, newest first: the
    version, when its build ended (UTC), and which one is live."""
    if layout is None:
        return f"== {host}: {error or 'no listing'}"
    head = f"== {host}: live {layout.live or f'(not a release: {layout.target})'}"
    rows = [
        f"  {'*' if r.name == layout.live else ' '} {r.version:<32} "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(r.built))} UTC  {r.name}"
        + ("  (live)" if r.name == layout.live else "")
        for r in reversed(layout.releases)
    ]
    return "\n".join([head, *(rows or ["  (no complete release)"])])
