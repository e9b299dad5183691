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

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn start(
    dir: &std::path::Path,
) -> Result<(std::net::SocketAddr, tokio::sync::watch::Sender<bool>), Box<dyn std::error::Error>> {
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let kafka = Arc::new(Kafka::new(
        broker,
        KafkaConfig::default(),
        rokka_group::GroupConfig::default(),
        addr,
    ));
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(rokka_kafka::serve(listener, kafka, rx));
    Ok((addr, tx))
}

/// A frame: a well-formed request header for `key`/`version`, then `body`.
fn frame(key: ApiKey, version: i16, body: &[u8]) -> Result<Bytes, Box<dyn std::error::Error>> {
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
async fn poke(addr: std::net::SocketAddr, frame: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
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
