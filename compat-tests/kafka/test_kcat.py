"""Debian 12's kcat (librdkafka 2.0.2): produce, consume, metadata."""
import subprocess


def kcat(rokka, *args, input=None, timeout=30):
    return subprocess.run(
        ["kcat", "-b", rokka.bootstrap, *args],
        input=input,
        capture_output=True,
        timeout=timeout,
        check=True,
    )


def test_produce_consume_keys_and_headers(rokka, topic):
    lines = "".join(f"key{i}:value {i}\n" for i in range(100))
    kcat(rokka, "-P", "-t", topic, "-K:", "-H", "h1=v1", input=lines.encode())
    out = kcat(rokka, "-C", "-t", topic, "-e", "-f", "%k|%s|%o|%h\n").stdout.decode().splitlines()
    assert len(out) == 100
    for i, line in enumerate(out):
        k, v, o, h = line.split("|")
        assert (k, v, int(o)) == (f"key{i}", f"value {i}", i)
        assert h == "h1=v1"


def test_every_compression_codec(rokka, topic):
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
        data = "".join(f"{codec}-{i}\n" for i in range(50))
        kcat(rokka, "-P", "-t", topic, "-z", codec, input=data.encode())
    out = kcat(rokka, "-C", "-t", topic, "-e", "-f", "%s\n").stdout.decode().splitlines()
    assert len(out) == 250
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
        assert [l for l in out if l.startswith(codec + "-")] == [f"{codec}-{i}" for i in range(50)]


def test_metadata_lists_the_topic(rokka, topic):
    kcat(rokka, "-P", "-t", topic, input=b"x\n")
    out = kcat(rokka, "-L", "-t", topic).stdout.decode()
    assert f'topic "{topic}" with 1 partitions' in out
    assert "leader 0" in out


def test_consume_from_offset_and_end(rokka, topic):
    kcat(rokka, "-P", "-t", topic, input="".join(f"m{i}\n" for i in range(20)).encode())
    out = kcat(rokka, "-C", "-t", topic, "-o", "15", "-e", "-f", "%s\n").stdout.decode().split()
    assert out == [f"m{i}" for i in range(15, 20)]
    out = kcat(rokka, "-C", "-t", topic, "-o", "-3", "-e", "-f", "%s\n").stdout.decode().split()
    assert out == ["m17", "m18", "m19"]
