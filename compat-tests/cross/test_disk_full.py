"""A data directory on a file system that really fills up (a 256 MiB ext4
image, loop-mounted): docs/store.md "A full disk".

With the disk-use guards off, an append that needs room the disk does not
have is refused (Kafka KAFKA_STORAGE_ERROR, which producers retry), reads
go on, and the periodic writes (checkpoint, offsets) fail quietly — logged
when they start failing and when they work again. A rokka killed while the
disk is full starts again on it (it used to stop at its first checkpoint
write) and serves every acknowledged record; once room comes back writes
resume. With the guards on, a disk another process filled to the brim is
freed by retention after a start on it.

Mounting needs root (or password-less sudo) and a loop device; where
neither exists the module is skipped, saying why.
"""
import collections
import errno
import os
import shutil
import subprocess
import time

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer
from kafka.errors import KafkaStorageError

from realclients import log_since, metric, read_topic, wait_for
from rokka_fixture import Rokka, results_dir

FS_MIB = 256
SEGMENT = 16 << 20


def _priv():
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"]
    return None


@pytest.fixture(scope="module")
def disk():
    """A fresh ext4 file system of FS_MIB, mounted where a test's rokka keeps its data."""
    priv = _priv()
    if priv is None or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root (or sudo -n) and mkfs.ext4 to mount a small file system")
    mounts = []

    def make(workdir):
        image = os.path.join(workdir, "disk.img")
        mnt = os.path.join(workdir, "disk")
        os.makedirs(mnt, exist_ok=True)
        with open(image, "wb") as f:
            f.truncate(FS_MIB << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", image], check=True, capture_output=True)
        p = subprocess.run([*priv, "mount", "-o", "loop", image, mnt], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot loop-mount a file system here: {p.stderr.strip()}")
        mounts.append((mnt, image))
        subprocess.run([*priv, "chown", str(os.getuid()), mnt], check=True)
        # The store refuses files it did not write in its directory: the
        # data lives one level down, other files beside it.
        os.makedirs(os.path.join(mnt, "data"))
        os.symlink(os.path.join(mnt, "data"), os.path.join(workdir, "data"))
        return mnt

    yield make
    for mnt, image in mounts:
        subprocess.run([*priv, "umount", "-l", mnt], capture_output=True)
        os.remove(image)


def fill_disk(mnt, name="filler"):
    """Another process's file takes every free block; returns its path."""
    path = os.path.join(mnt, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 20, 4096, 1024):
            block = b"\0" * size
            while True:
                try:
                    os.write(fd, block)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
    finally:
        os.close(fd)
    st = os.statvfs(mnt)
    assert st.f_bavail * st.f_frsize < 64 << 10, "the disk is not full"
    return path


def produce(rokka, topic, n, size=1000):
    """n records with acks=all; returns how many were acknowledged."""
    p = Producer({"bootstrap.servers": rokka.bootstrap, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 15000})
    acked = []
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=b"%08d" % i + b"x" * (size - 8),
                          on_delivery=lambda e, m: e is None and acked.append(m.offset()))
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    p.flush(30)
    return len(acked)


def produce_until_refused(rokka, topic, limit=200_000):
    """Sends one 1 KB record at a time without retries until the broker refuses one."""
    p = KafkaProducer(bootstrap_servers=rokka.bootstrap, acks=1, retries=0, linger_ms=0)
    try:
        for i in range(limit):
            try:
                p.send(topic, b"%08d" % i + b"y" * 992).get(timeout=10)
            except KafkaStorageError:
                return i
        raise AssertionError(f"{limit} records taken on a full disk")
    finally:
        p.close()


def make_rokka(disk, name, store_extra):
    workdir = results_dir("cross", name)
    mnt = disk(workdir)
    return mnt, Rokka(
        workdir,
        store_base=f"commitlog_segment_bytes = {SEGMENT}\nprefault_window_bytes = 2097152",
        store_extra="index_slots = 50000\nindex_entries = 200000\nretention_check_interval_ms = 500\n" + store_extra,
    )


def test_a_full_disk_refuses_writes_keeps_reads_and_a_restart_on_it_loses_nothing(disk):
    mnt, r = make_rokka(disk, "test_disk_full", "disk_max_used_percent = 0\ndisk_refuse_writes_percent = 0")
    r.start()
    try:
        assert produce(r, "full", 20_000) == 20_000
        filler = fill_disk(mnt)
        # The segment's room that was allocated before the disk filled still
        # takes records; then the next segment cannot be made.
        taken = produce_until_refused(r, "full")
        total = 20_000 + taken
        assert len(read_topic(r, "full")) == total
        # A crash on the full disk, and a start on it.
        r.kill()
        r.start()
        got = collections.Counter(int(v[:8]) for _, _, v in read_topic(r, "full"))
        assert got == collections.Counter(range(20_000)) + collections.Counter(range(taken))
        # The periodic writes fail every interval, counted, logged once.
        assert wait_for("a failed checkpoint counted",
                        lambda: metric(r, "rokka_store_background_write_failures_total", what="checkpoint") >= 2, 20)
        log = log_since(r, 0)
        assert log.count('periodic write failed') <= 3, "logged on every failure"
        assert "no room for the checkpoint at start" in log
        # Room comes back: writes resume, and a clean stop and start keep all.
        os.remove(filler)
        assert produce(r, "full", 30_000) == 30_000
        assert wait_for("the checkpoint written again", lambda: "periodic write works again" in log_since(r, 0), 20)
        assert r.stop() == 0
        r.start()
        assert len(read_topic(r, "full")) == total + 30_000
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def test_a_start_on_a_disk_another_process_filled_frees_room_by_retention(disk):
    mnt, r = make_rokka(disk, "test_disk_full_retention", "disk_max_used_percent = 60\ndisk_refuse_writes_percent = 90")
    r.start()
    try:
        # ~60 MiB of records (four segments), then someone else's file takes the rest.
        assert produce(r, "keep", 60_000) == 60_000
        r.kill()
        fill_disk(mnt)
        r.start()
        # Retention deletes the oldest segments (the disk is over 60 %) and
        # producers get through again.
        assert wait_for("segments deleted", lambda: metric(r, "rokka_store_segments_deleted_total") >= 1, 30)
        assert produce(r, "keep", 1000) == 1000
        records = read_topic(r, "keep")
        assert 1000 < len(records) < 61_000
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"
