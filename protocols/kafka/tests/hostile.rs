//! Hostile Kafka requests: counts and lengths that lie, random bodies behind
//! every served API key and version. Each one gets an answer or a closed
//! connection, and the broker (in this process: an abort fails the test)
//! keeps serving a well-behaved client afterwards.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rand::{Rng, SeedableRng};
use rokka_broker::{Broker, BrokerConfig};
use rokka_kafka::{Kafka, KafkaConfig};
use rokka_store::{MessageStore, StoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

type Started = (std::net::SocketAddr, tokio::sync::watch::Sender<bool>);

async fn start(dir: &std::path::Path) -> Result<Started, Box<dyn std::error::Error + Send + Sync>> {
    start_with(dir, KafkaConfig::default()).await
}

async fn start_with(
    dir: &std::path::Path,
    cfg: KafkaConfig,
) -> Result<Started, Box<dyn std::error::Error + Send + Sync>> {
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let kafka = Arc::new(Kafka::new(broker, cfg, rokka_group::GroupConfig::default(), addr));
    let (tx, rx) = tokio::sync::watch::channel(false);
    rokka_kafka::spawn_background(&kafka, &rx);
    let at = kafka.plaintext();
    tokio::spawn(rokka_kafka::serve(listener, kafka, at, None, rx));
    Ok((addr, tx))
}

/// A frame: a well-formed request header for `key`/`version`, then `body`.
fn frame(key: ApiKey, version: i16, body: &[u8]) -> Result<Bytes, Box<dyn std::error::Error + Send + Sync>> {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(11)
        .with_client_id(Some(StrBytes::from_static_str("hostile")))
        .encode(&mut buf, key.request_header_version(version))?;
    buf.put_slice(body);
    let n = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&n.to_be_bytes());
    Ok(buf.freeze())
}

/// Sends one frame and waits for an answer or a close (never a hang).
async fn poke(addr: std::net::SocketAddr, frame: &[u8]) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(frame).await?;
    let mut sink = vec![0u8; 64 * 1024];
    // Either an answer (its form is checked elsewhere) or a close.
    let outcome = tokio::time::timeout(Duration::from_secs(10), s.read(&mut sink)).await;
    match outcome {
        Ok(_) => Ok(()),
        Err(_) => Err(format!(
            "no answer and no close within 10 s for {:02x?}",
            &frame[..frame.len().min(32)]
        )
        .into()),
    }
}

/// The broker still answers a well-behaved ApiVersions request.
async fn still_serving(addr: std::net::SocketAddr) -> TestResult {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(&frame(ApiKey::ApiVersions, 0, &[])?).await?;
    let len = tokio::time::timeout(Duration::from_secs(10), s.read_i32()).await?? as usize;
    let mut resp = vec![0u8; len];
    s.read_exact(&mut resp).await?;
    let mut b = Bytes::from(resp);
    ResponseHeader::decode(&mut b, 0)?;
    let r = ApiVersionsResponse::decode(&mut b, 0)?;
    assert_eq!(r.error_code, 0);
    assert!(!r.api_keys.is_empty());
    Ok(())
}

/// Every API key and version Rokka serves, including the versions it lists but refuses.
fn served() -> Vec<(ApiKey, i16)> {
    let mut out = Vec::new();
    for (key, min, max) in rokka_kafka::versions::SUPPORTED {
        for v in *min..=*max {
            out.push((*key, v));
        }
    }
    out
}

#[tokio::test]
async fn metadata_with_a_huge_topic_count_is_refused_not_allocated() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    // The 18-byte request of the finding: Metadata v1, topic array count 0x7FFFFFFF.
    let f = frame(ApiKey::Metadata, 1, &0x7FFF_FFFFi32.to_be_bytes())?;
    poke(addr, &f).await?;
    still_serving(addr).await
}

#[tokio::test]
async fn lying_counts_and_lengths_behind_every_api() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    // Bodies whose first fields claim the most they can: i32 counts and
    // lengths of 0x7FFFFFFF, varints of 2^31, then nothing or a little more.
    let bodies: Vec<Vec<u8>> = vec![
        [0x7F, 0xFF, 0xFF, 0xFF].repeat(8),
        [0x7F, 0xFF, 0xFF, 0xF0].to_vec(),
        [0xFF, 0xFF, 0xFF, 0xFF, 0x0F].repeat(6),
        [0x00, 0x01, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF].to_vec(),
        [0x00, 0x00, 0x7F, 0xFF, 0xFF, 0xFF].repeat(4),
    ];
    for (key, version) in served() {
        for body in &bodies {
            poke(addr, &frame(key, version, body)?)
                .await
                .map_err(|e| format!("{key:?} v{version}: {e}"))?;
        }
    }
    still_serving(addr).await
}

#[tokio::test]
async fn random_bodies_behind_every_api() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0510_4b41);
    for (key, version) in served() {
        for _ in 0..12 {
            let n = rng.gen_range(0..96);
            let body: Vec<u8> = (0..n)
                .map(|_| match rng.gen_range(0..4) {
                    0 => 0xFF,
                    1 => 0x7F,
                    _ => rng.gen(),
                })
                .collect();
            poke(addr, &frame(key, version, &body)?)
                .await
                .map_err(|e| format!("{key:?} v{version} {body:02x?}: {e}"))?;
        }
    }
    still_serving(addr).await
}

/// Whether the broker closes `s` within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 4096];
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(left, s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn idle_dribbling_and_surplus_connections_are_closed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = KafkaConfig {
        idle_timeout_ms: 400,
        max_connections_per_ip: 4,
        ..KafkaConfig::default()
    };
    let (addr, _stop) = start_with(dir.path(), cfg).await?;
    let mut idle = TcpStream::connect(addr).await?;
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "idle connection kept"
    );
    // A frame sent a byte every 100 ms never completes within the timeout.
    let f = frame(ApiKey::ApiVersions, 0, &[])?;
    let mut slow = TcpStream::connect(addr).await?;
    let mut closed = false;
    for b in f.iter().cycle().take(60) {
        if slow.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        let mut probe = [0u8; 64];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(100), slow.read(&mut probe)).await {
            closed = true;
            break;
        }
    }
    assert!(closed, "a connection dribbling a frame was kept");
    // A frame declaring 90 MB then sending nothing holds no 90 MB and is
    // closed at the idle timeout.
    let mut liar = TcpStream::connect(addr).await?;
    liar.write_all(&(90i32 << 20).to_be_bytes()).await?;
    liar.write_all(&f[4..]).await?;
    assert!(
        closed_within(&mut liar, Duration::from_secs(5)).await,
        "half-sent frame kept"
    );
    // Four connections from one address; a fifth is refused.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(&f).await?;
        let mut len = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut len)).await??;
        let mut rest = vec![0u8; i32::from_be_bytes(len) as usize];
        s.read_exact(&mut rest).await?;
        held.push(s);
    }
    let mut fifth = TcpStream::connect(addr).await?;
    assert!(
        closed_within(&mut fifth, Duration::from_secs(5)).await,
        "fifth connection from one address admitted"
    );
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while still_serving(addr).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "slots not released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test]
async fn request_bytes_in_flight_are_budgeted() -> TestResult {
    let dir = tempfile::tempdir()?;
    // A budget of 1 MiB: a connection that declared a 1 MiB frame and sent
    // half of it holds the budget; a second must wait, then proceeds once
    // the first is closed.
    let cfg = KafkaConfig {
        max_inflight_request_bytes: 1 << 20,
        ..KafkaConfig::default()
    };
    let (addr, _stop) = start_with(dir.path(), cfg).await?;
    let mut first = TcpStream::connect(addr).await?;
    first.write_all(&(1i32 << 20).to_be_bytes()).await?;
    first.write_all(&vec![0u8; 512 << 10]).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = tokio::spawn(async move { still_serving(addr).await.map_err(|e| e.to_string()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a request was read past the in-flight budget");
    drop(first);
    let r = tokio::time::timeout(Duration::from_secs(5), waiting).await??;
    assert!(r.is_ok(), "{r:?}");
    Ok(())
}
