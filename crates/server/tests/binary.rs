//! The `rokka` binary end to end: starts on a temp data dir, serves store
//! metrics on /metrics, and shuts down cleanly on SIGTERM (clean checkpoint,
//! abort marker removed); a bad config is refused with the key named.
//! Every listener binds port 0 and the ports file says which ports rokka got.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The port of `key` in the ports file rokka writes once it has bound
/// every listener (`{"kafka": "127.0.0.1:40001", ...}`).
fn reported_port(ports_file: &std::path::Path, key: &str) -> Option<u16> {
    let text = std::fs::read_to_string(ports_file).ok()?;
    let map: std::collections::BTreeMap<String, String> = serde_json::from_str(&text).ok()?;
    map.get(key)?.rsplit(':').next()?.parse().ok()
}

fn get_metrics(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// A config for a node in `dir` with every listener on 127.0.0.1 port 0
/// (Kafka's on `kafka`), data under `dir/data`, and `extra` TOML lines first.
fn node_config(dir: &std::path::Path, extra: &str, kafka: &str) -> std::io::Result<std::path::PathBuf> {
    let cfg = dir.join("rokka.toml");
    std::fs::write(
        &cfg,
        format!(
            "{extra}\n[metrics]\nlisten = \"127.0.0.1:0\"\n[store]\ndata_dir = \"{}\"\ncommitlog_segment_bytes = 8388608\n\
             preallocate = false\ndisk_max_used_percent = 0\ndisk_refuse_writes_percent = 0\n[kafka]\nlisten = \"{kafka}\"\n[rocketmq]\nnamesrv_listen = \"127.0.0.1:0\"\n\
             broker_listen = \"127.0.0.1:0\"\n",
            dir.join("data").display()
        ),
    )?;
    Ok(cfg)
}

/// SIGTERM to `child`, then its exit status (an error after 20 s).
fn stop(child: &mut std::process::Child) -> Result<std::process::ExitStatus, Box<dyn std::error::Error>> {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("rokka did not stop on SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serves_metrics_and_stops_cleanly_on_sigterm() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = node_config(dir.path(), "", "127.0.0.1:0")?;
    let ports = dir.path().join("ports.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rokka"))
        .arg("--config")
        .arg(&cfg)
        .arg("--ports-file")
        .arg(&ports)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let served = reported_port(&ports, "metrics").and_then(get_metrics);
        if let Some(b) = served.filter(|b| b.contains("rokka_store_commitlog_segments")) {
            break b;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("metrics endpoint never served store metrics".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(body.contains("rokka_store_recovery_seconds"), "{body}");
    for key in ["kafka", "namesrv", "broker"] {
        let port = reported_port(&ports, key).ok_or(format!("no {key} port in the ports file"))?;
        assert_ne!(port, 0);
        TcpStream::connect(("127.0.0.1", port))?;
    }
    assert!(dir.path().join("data/abort").exists());
    let exit = stop(&mut child)?;
    assert!(exit.success(), "exit status {exit}");
    assert!(!dir.path().join("data/abort").exists(), "abort marker left behind");
    assert!(dir.path().join("data/checkpoint").exists());
    Ok(())
}

/// Starts rokka with `[log]` lines `log`, stdout to a file (not a
/// terminal), waits until it has bound everything, stops it; its stdout.
fn logs_of_a_run(log: &str) -> Result<String, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let cfg = node_config(dir.path(), &format!("[log]\n{log}"), "127.0.0.1:0")?;
    let ports = dir.path().join("ports.json");
    let out_path = dir.path().join("stdout.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rokka"))
        .arg("--config")
        .arg(&cfg)
        .arg("--ports-file")
        .arg(&ports)
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while reported_port(&ports, "kafka").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("rokka did not start".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(&mut child)?;
    Ok(std::fs::read_to_string(out_path)?)
}

#[test]
fn logs_to_a_file_carry_no_colour_codes_and_can_be_json() -> TestResult {
    let text = logs_of_a_run("format = \"text\"")?;
    assert!(text.contains("Kafka listener"), "{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a file: {text}");
    let json = logs_of_a_run("format = \"json\"")?;
    let lines: Vec<&str> = json.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "{json}");
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(line)?;
        assert!(v.get("level").is_some() && v.get("timestamp").is_some(), "{line}");
    }
    assert!(json.contains("Kafka listener"), "{json}");
    Ok(())
}

#[test]
fn bad_config_is_refused_naming_the_key() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[store]\nflush_mode = 3\n")?;
    let out = Command::new(env!("CARGO_BIN_EXE_rokka"))
        .arg("--config")
        .arg(&cfg)
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("flush_mode") && err.contains("bad.toml"), "{err}");
    Ok(())
}

#[test]
fn a_listener_beyond_loopback_without_consent_is_refused_before_anything_is_bound() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = node_config(dir.path(), "", "0.0.0.0:0")?;
    let data = dir.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_rokka"))
        .arg("--config")
        .arg(&cfg)
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kafka.listen = 0.0.0.0:0") && err.contains("allow_unauthenticated_non_loopback"),
        "{err}"
    );
    assert!(!err.contains("metrics.listen"), "{err}");
    assert!(!data.exists(), "the store was opened");
    Ok(())
}

fn store_cfg(dir: &std::path::Path) -> rokka_store::StoreConfig {
    let mut c = rokka_store::StoreConfig::for_tests(dir);
    c.checkpoint_interval_ms = 3_600_000;
    c
}

fn append(store: &rokka_store::MessageStore, i: u64) -> rokka_store::Result<rokka_store::AppendResult> {
    let body = format!("message-{i}-{}", "x".repeat(100));
    let props = rokka_store::record::properties::encode([("KEYS", format!("k{i}").as_str())]);
    store.append_message(&rokka_store::MessageInput::new(
        "C",
        0,
        body.as_bytes(),
        props.as_bytes(),
    ))
}

fn check(cfg_path: &std::path::Path, extra: &[&str]) -> Result<(Option<i32>, String), Box<dyn std::error::Error>> {
    let out = Command::new(env!("CARGO_BIN_EXE_rokka"))
        .arg("--config")
        .arg(cfg_path)
        .args(["store", "check"])
        .args(extra)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.code(), text))
}

#[test]
fn store_check_finds_damage_and_reappends_lost_found() -> TestResult {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let cfg_path = dir.path().join("rokka.toml");
    std::fs::write(
        &cfg_path,
        format!(
            "[store]\ndata_dir = \"{}\"\ncommitlog_segment_bytes = {}\nmax_message_bytes = 4194304\n\
             consume_queue_entries_per_file = 1024\nindex_slots = 4096\nindex_entries = 16384\n\
             disk_max_used_percent = 0\ndisk_refuse_writes_percent = 0\n",
            data.display(),
            store_cfg(&data).commitlog_segment_bytes
        ),
    )?;
    let store = rokka_store::MessageStore::open(store_cfg(&data))?;
    let rs: Vec<_> = (0..40).map(|i| append(&store, i)).collect::<Result<_, _>>()?;
    store.close()?;
    drop(store);
    let (code, out) = check(&cfg_path, &[])?;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("40 entries") && out.trim_end().ends_with("ok"), "{out}");

    // Zeroed ConsumeQueue tail: messages the CommitLog holds are hidden.
    let cq = data.join("consumequeue/C/0/00000000000000000000");
    let f = std::fs::OpenOptions::new().write(true).open(&cq)?;
    std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 48 * 5], 35 * 48)?;
    drop(f);
    let (code, out) = check(&cfg_path, &[])?;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("C/0: the CommitLog holds records up to offset 40 but the ConsumeQueue ends at 35"),
        "{out}"
    );

    // A crash with a damaged record past the checkpoint: recovery (at the
    // next open) cuts the log there and keeps the rest in lost+found.
    let store = rokka_store::MessageStore::open(store_cfg(&data))?;
    let more: Vec<_> = (40..60).map(|i| append(&store, i)).collect::<Result<_, _>>()?;
    drop(store); // crash: abort marker left
    let seg = data.join("commitlog").join(format!("{:020}", 0));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&seg)?;
    let at = more[5].phys_offset + 60;
    let mut b = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, at)?;
    std::os::unix::fs::FileExt::write_all_at(&f, &[b[0] ^ 0x41], at)?;
    drop(f);
    let (code, out) = check(&cfg_path, &["--reappend-lost-found"])?;
    // The check (before recovery) sees the damaged entry; then the store is
    // opened, recovery cuts the log and saves 45..59, and the 14 intact
    // ones are appended again.
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("damaged entry"), "{out}");
    assert!(out.contains("re-appended 14 entries from 1 lost+found files"), "{out}");
    let store = rokka_store::MessageStore::open(store_cfg(&data))?;
    assert_eq!(store.max_offset("C", 0), 45 + 14);
    let (code, out) = {
        drop(store);
        check(&cfg_path, &[])?
    };
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(rs.len(), 40);
    Ok(())
}

/// `--namesrv-only` serves a name server alone, whatever else the config
/// (or the embedded defaults) turn on: the gRPC service and the console
/// need the store, and with them on it exited 1 ("grpc.enabled needs the
/// store") — the embedded defaults turn both on.
#[test]
fn namesrv_only_runs_a_name_server_whatever_else_is_on() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = node_config(
        dir.path(),
        "[grpc]\nenabled = true\nlisten = \"127.0.0.1:0\"\n[console]\nenabled = true\nlisten = \"127.0.0.1:0\"",
        "127.0.0.1:0",
    )?;
    let ports = dir.path().join("ports.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rokka"))
        .arg("--config")
        .arg(&cfg)
        .arg("--namesrv-only")
        .arg("--ports-file")
        .arg(&ports)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while reported_port(&ports, "namesrv").is_none() {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err)?;
            }
            return Err(format!("rokka --namesrv-only exited {status}: {err}").into());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("no name server port reported".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reported_port(&ports, "grpc").is_none() && reported_port(&ports, "kafka").is_none());
    assert!(!dir.path().join("data").exists(), "no store opened");
    assert!(stop(&mut child)?.success());
    Ok(())
}
