"""The real node's containerd keeps no image that no name points at: loading a new build of an image
(``cluster.py load-image``) removes the old one whole, content and snapshots, and never the pause
image. Before, the CRI plugin's ``sha256:<id>`` reference kept every old torch image (5.5 GB each) on
a machine that runs CI again and again (its containerd root is in ~/.cache): the likely way CI's
node came to lose its pause image twice, to the kubelet's reclaim under disk pressure.

An image is streamed from ``docker save`` into ``ctr images import``; ctr stops reading at the
archive's end marker, so a ``docker save`` still writing then dies of SIGPIPE with the image whole
in containerd (CI's torch load failed so): such an import counts, a failed one says why.

The listing test is pure; the other runs a containerd of its own (root and the containerd binary
needed), on a socket and root under the test's temporary folder, beside any other.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_kit import ROOT

sys.path.insert(0, str(ROOT / "hack" / "cluster"))
import realnode  # noqa: E402

LISTING = """\
REF                                  TYPE                                                 DIGEST      SIZE      PLATFORMS   LABELS
docker.io/library/elasticps:latest   application/vnd.docker.distribution.manifest.v2+json sha256:new  5.5 GiB   linux/amd64 io.cri-containerd.image=managed
registry.k8s.io/pause:3.10.1         application/vnd.docker.distribution.manifest.v2+json sha256:pause 40.8 KiB  linux/amd64 io.cri-containerd.image=managed,io.cri-containerd.pinned=pinned
sha256:oldid                         application/vnd.docker.distribution.manifest.v2+json sha256:old  5.5 GiB   linux/amd64 io.cri-containerd.image=managed
sha256:newid                         application/vnd.docker.distribution.manifest.v2+json sha256:new  5.5 GiB   linux/amd64 io.cri-containerd.image=managed
sha256:pauseid                       application/vnd.docker.distribution.manifest.v2+json sha256:pause 40.8 KiB  linux/amd64 io.cri-containerd.image=managed
"""


def test_only_the_ids_of_images_no_name_points_at_are_stale() -> None:
    assert realnode.stale_image_ids(LISTING) == ["sha256:oldid"]
    assert realnode.stale_image_ids(LISTING.splitlines()[0]) == []  # nothing imported yet


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Path]:
    binary = shutil.which("containerd")
    if binary is None or os.geteuid() != 0:
        pytest.skip("needs root and containerd (apt-get install containerd)")
    sock = tmp_path / "c.sock"
    config = tmp_path / "containerd.toml"
    config.write_text(f'version = 2\nroot = "{tmp_path / "root"}"\nstate = "{tmp_path / "state"}"\n'
                      f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n')  # fmt: skip
    with (tmp_path / "containerd.log").open("wb") as log:
        process = subprocess.Popen([binary, "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while realnode.ctr(sock, "version", check=False).returncode != 0:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "containerd.log").read_text()
            time.sleep(0.2)
        yield sock
    finally:
        process.terminate()
        process.wait(timeout=30)
        realnode.unmount_under(tmp_path)


@pytest.mark.node
def test_a_new_build_under_an_old_name_takes_the_old_image_away_and_leaves_the_pause_image(containerd: Path) -> None:
    sock, name = containerd, "docker.io/library/elasticps:latest"
    realnode.ensure_pause(sock, Path("/bin/true"), "3.10.1")
    blobs = [content(sock)]
    for binary in ("/bin/ls", "/bin/cat"):  # two builds of one name, each its own single layer
        realnode.ctr(sock, "images", "import", "-", input=realnode.pause_archive(Path(binary), name))
        blobs.append(content(sock))
    old_build = blobs[1] - blobs[0]  # its manifest, config and layer
    listing = realnode.ctr(sock, "images", "ls").stdout.decode()
    stale = realnode.stale_image_ids(listing)
    assert len(stale) == 1, listing  # the first build, kept by the CRI plugin's id reference alone

    removed = realnode.remove_unnamed_images(sock)

    assert removed == stale
    refs = realnode.ctr(sock, "images", "ls", "-q").stdout.decode().split()
    assert name in refs and realnode.pause_image("3.10.1") in refs and stale[0] not in refs
    assert realnode.stale_image_ids(realnode.ctr(sock, "images", "ls").stdout.decode()) == []
    checked = realnode.ctr(sock, "images", "check").stdout.decode()
    kept = [line for line in checked.splitlines()[1:] if line.split()[0] in (name, realnode.pause_image("3.10.1"))]
    assert len(kept) == 2 and all("complete (2/2)" in line for line in kept), checked
    snapshots = realnode.ctr(sock, "snapshots", "ls").stdout.decode().splitlines()[1:]
    assert len(snapshots) == 2, snapshots  # the new build's layer and the pause image's: the old one's went
    assert len(old_build) >= 3 and not old_build & content(sock)  # manifest, config, layer (at least)


def content(sock: Path) -> set[str]:
    return set(realnode.ctr(sock, "content", "ls", "-q").stdout.decode().split())


@pytest.mark.node
def test_a_producer_killed_by_sigpipe_after_the_archive_was_imported_counts_and_a_failed_import_says_why(
        containerd: Path, tmp_path: Path) -> None:
    sock, name = containerd, "docker.io/library/elasticps:piped"
    archive = tmp_path / "image.tar"
    archive.write_bytes(realnode.pause_archive(Path("/bin/ls"), name))
    config = "sha256:" + manifest(archive)["Config"].removesuffix(".json")
    # As docker save when ctr was quicker: the archive, then bytes written after ctr stopped reading.
    late_writer = ["sh", "-c", f"cat {archive}; sleep 1; exec head -c 1000000 /dev/zero"]

    realnode.stream_import(sock, late_writer, name, config)

    assert realnode.holds_image(sock, name, config)
    assert "complete (2/2)" in realnode.ctr(sock, "images", "check").stdout.decode()
    with pytest.raises(RuntimeError, match=r"sh -c: exit -13.*ctr images import: exit 0"):
        realnode.stream_import(sock, late_writer, "docker.io/library/elasticps:other", config)  # not what it holds
    truncated = ["sh", "-c", f"head -c 70000 {archive}; exit 3"]
    with pytest.raises(RuntimeError, match=r"sh -c: exit 3.*ctr images import: exit [1-9]"):
        realnode.stream_import(sock, truncated, "docker.io/library/elasticps:cut", config)


def manifest(archive: Path) -> dict[str, object]:
    with tarfile.open(archive) as t:
        member = t.extractfile("manifest.json")
        assert member is not None
        entries: list[dict[str, object]] = json.load(io.BytesIO(member.read()))
    return entries[0]
