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

#[test]
fn serves_metrics_and_stops_cleanly_on_sigterm() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("rokka.toml");
    let ports = dir.path().join("ports.json");
    std::fs::write(
        &cfg,
        format!(
            "[metrics]\nlisten = \"127.0.0.1:0\"\n[store]\ndata_dir = \"{}\"\ncommitlog_segment_bytes = 8388608\npreallocate = false\n\
             [kafka]\nlisten = \"127.0.0.1:0\"\n[rocketmq]\nnamesrv_listen = \"127.0.0.1:0\"\nbroker_listen = \"127.0.0.1:0\"\n",
            dir.path().join("data").display()
        ),
    )?;
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
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("rokka did not stop on SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "exit status {exit}");
    assert!(!dir.path().join("data/abort").exists(), "abort marker left behind");
    assert!(dir.path().join("data/checkpoint").exists());
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
