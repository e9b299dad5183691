//! What one RocketMQ client can make a listener spend: requests in flight
//! per connection (a client that pipelines and never reads its answers
//! stops being read), connections per source address, idle connections and
//! frames dribbled a byte at a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rokka_broker::{Broker, BrokerConfig};
use rokka_remoting::codes::request as rq;
use rokka_remoting::*;
use rokka_store::{MessageStore, StoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A name server (no store needed) with `cfg`.
type Started = (std::net::SocketAddr, Arc<NameServer>, tokio::sync::watch::Sender<bool>);

async fn namesrv(cfg: RocketMqConfig) -> Result<Started, Box<dyn std::error::Error>> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let ns = Arc::new(NameServer::new(cfg, None));
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, Arc::clone(&ns), rx));
    Ok((addr, ns, tx))
}

fn frame(code: i32, opaque: i32) -> BytesMut {
    let mut c = RemotingCommand::request(code, 0);
    c.opaque = opaque;
    c.version = 453;
    let mut out = BytesMut::new();
    encode(&c, &mut out);
    out
}

/// One request answered on a fresh connection within 5 s.
async fn answered(addr: std::net::SocketAddr) -> TestResult {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(&frame(rq::GET_BROKER_CLUSTER_INFO, 1)).await?;
    let mut buf = BytesMut::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(c) = decode(&mut buf, DEFAULT_MAX_FRAME)? {
            assert!(c.is_response());
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, s.read_buf(&mut buf)).await?? == 0 {
            return Err("closed before answering".into());
        }
    }
}

/// Whether the server closes `s` within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Pipelines requests on one connection for `secs` without reading an
/// answer; returns the most answers the listener held unwritten meanwhile.
async fn hog(
    addr: std::net::SocketAddr,
    code: i32,
    secs: u64,
    unwritten: impl Fn() -> usize,
) -> Result<usize, Box<dyn std::error::Error>> {
    let one = frame(code, 7);
    let mut chunk = BytesMut::new();
    for _ in 0..1000 {
        chunk.extend_from_slice(&one);
    }
    let chunk = chunk.freeze();
    let mut s = TcpStream::connect(addr).await?;
    let writing = tokio::spawn(async move {
        loop {
            if s.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        most = most.max(unwritten());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writing.abort();
    Ok(most)
}

#[tokio::test]
async fn a_pipelining_client_that_never_reads_stops_being_read() -> TestResult {
    let cfg = RocketMqConfig {
        max_inflight_requests_per_connection: 16,
        ..RocketMqConfig::default()
    };
    let (addr, ns, _stop) = namesrv(cfg).await?;
    // Answers queued without bound would pile up here once the kernel's
    // socket buffers are full (2.8 GB in 30 s in the finding).
    let most = hog(addr, rq::GET_BROKER_CLUSTER_INFO, 4, || ns.limits().unwritten_answers()).await?;
    assert!(
        most <= 16,
        "{most} answers held for a client that never reads (limit 16)"
    );
    // Others are served meanwhile.
    answered(addr).await?;
    Ok(())
}

#[tokio::test]
async fn connections_per_source_address_are_capped() -> TestResult {
    let cfg = RocketMqConfig {
        max_connections_per_ip: 3,
        ..RocketMqConfig::default()
    };
    let (addr, _ns, _stop) = namesrv(cfg).await?;
    let mut held = Vec::new();
    for _ in 0..3 {
        let s = TcpStream::connect(addr).await?;
        held.push(s);
    }
    // Make sure the three were admitted before the fourth arrives.
    for s in &mut held {
        s.write_all(&frame(rq::GET_BROKER_CLUSTER_INFO, 1)).await?;
        let mut b = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b)).await??;
    }
    let mut fourth = TcpStream::connect(addr).await?;
    assert!(
        closed_within(&mut fourth, Duration::from_secs(5)).await,
        "fourth connection from one address admitted"
    );
    drop(held);
    // Slots are released with their connections.
    let deadline = Instant::now() + Duration::from_secs(5);
    while answered(addr).await.is_err() {
        assert!(Instant::now() < deadline, "slots not released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test]
async fn idle_and_dribbling_connections_are_closed() -> TestResult {
    let cfg = RocketMqConfig {
        idle_timeout_ms: 400,
        ..RocketMqConfig::default()
    };
    let (addr, _ns, _stop) = namesrv(cfg).await?;
    let mut idle = TcpStream::connect(addr).await?;
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "idle connection kept"
    );
    // Slowloris: one byte of a frame every 100 ms never completes a frame.
    let mut slow = TcpStream::connect(addr).await?;
    let f = frame(rq::GET_BROKER_CLUSTER_INFO, 1);
    let started = Instant::now();
    let mut closed = false;
    for b in f.iter().cycle().take(100) {
        if slow.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        let mut probe = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(100), slow.read(&mut probe)).await {
            closed = true;
            break;
        }
    }
    assert!(closed, "a connection dribbling bytes was kept");
    assert!(started.elapsed() < Duration::from_secs(5));
    // A connection that keeps sending whole frames stays.
    let mut busy = TcpStream::connect(addr).await?;
    for i in 0..8 {
        busy.write_all(&frame(rq::GET_BROKER_CLUSTER_INFO, i)).await?;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut b = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), busy.read_exact(&mut b)).await??;
    Ok(())
}

#[tokio::test]
async fn a_broker_connection_that_never_reads_pull_answers_stops_being_read() -> TestResult {
    // The broker port too: heartbeats pipelined without reading.
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let cfg = RocketMqConfig {
        max_inflight_requests_per_connection: 8,
        ..RocketMqConfig::default()
    };
    let rmq = Arc::new(RocketMq::new(broker, cfg, addr));
    let (_tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, Arc::clone(&rmq), rx));
    let most = hog(addr, rq::GET_ALL_TOPIC_CONFIG, 4, || rmq.limits().unwritten_answers()).await?;
    assert!(most <= 8, "{most} answers held for a client that never reads (limit 8)");
    Ok(())
}

/// Reads one answer off `s` within `within`; false if none came.
async fn one_answer(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = BytesMut::new();
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(c)) = decode(&mut buf, DEFAULT_MAX_FRAME) {
            return c.is_response();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return false,
        }
    }
}

fn frame_with_body(code: i32, opaque: i32, body: usize) -> BytesMut {
    let mut c = RemotingCommand::request(code, 0);
    c.opaque = opaque;
    c.version = 453;
    c.body = bytes::Bytes::from(vec![b'x'; body]);
    let mut out = BytesMut::new();
    encode(&c, &mut out);
    out
}

#[tokio::test]
async fn request_bytes_in_flight_are_capped_over_the_listener() -> TestResult {
    let cfg = RocketMqConfig {
        max_inflight_request_bytes: 1024 * 1024,
        ..RocketMqConfig::default()
    };
    let (addr, ns, _stop) = namesrv(cfg).await?;
    assert_eq!(ns.limits().bytes.available_kib(), 1024);
    // A: declares a 900 KiB frame and sends only its first 64 KiB.
    let big = frame_with_body(rq::GET_BROKER_CLUSTER_INFO, 1, 900 * 1024);
    let mut a = TcpStream::connect(addr).await?;
    a.write_all(&big[..64 * 1024]).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while ns.limits().bytes.available_kib() > 1024 - 900 {
        assert!(Instant::now() < deadline, "the declared frame was not reserved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Small requests still fit and are served.
    answered(addr).await?;
    // B: a 300 KiB frame does not fit beside it: not read, not answered
    // (and, the budget being first come first served, requests after it wait too).
    let mut b = TcpStream::connect(addr).await?;
    b.write_all(&frame_with_body(rq::GET_BROKER_CLUSTER_INFO, 2, 300 * 1024))
        .await?;
    assert!(
        !one_answer(&mut b, Duration::from_millis(600)).await,
        "answered beyond the listener's request-byte budget"
    );
    // A completes: both are answered and the budget is whole again.
    a.write_all(&big[64 * 1024..]).await?;
    assert!(one_answer(&mut a, Duration::from_secs(5)).await, "A not answered");
    assert!(
        one_answer(&mut b, Duration::from_secs(5)).await,
        "B not answered once room was made"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while ns.limits().bytes.available_kib() != 1024 {
        assert!(Instant::now() < deadline, "request bytes not returned after answering");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A connection closed mid-frame returns what it reserved.
    let mut c = TcpStream::connect(addr).await?;
    c.write_all(&big[..64 * 1024]).await?;
    while ns.limits().bytes.available_kib() == 1024 {
        assert!(Instant::now() < deadline + Duration::from_secs(5), "not reserved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    while ns.limits().bytes.available_kib() != 1024 {
        assert!(Instant::now() < deadline, "a closed connection kept its reservation");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test]
async fn pulls_held_by_long_polling_do_not_stop_a_connections_other_requests() -> TestResult {
    // A client instance pulls every queue it consumes on a broker over one
    // connection, each pull held until messages come (15 s by default):
    // more queues than max_inflight_requests_per_connection must not stop
    // its heartbeats, sends and commits. Held pulls have a budget of their
    // own (max_held_pulls_per_connection).
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    broker.create_topic("Held", 16)?;
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let cfg = RocketMqConfig {
        max_inflight_requests_per_connection: 4,
        max_held_pulls_per_connection: 12,
        ..RocketMqConfig::default()
    };
    let rmq = Arc::new(RocketMq::new(Arc::clone(&broker), cfg, addr));
    let (_tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, Arc::clone(&rmq), rx));
    let pull = |queue: u32, opaque: i32| {
        let mut c = RemotingCommand::request(rq::PULL_MESSAGE, 0);
        c.opaque = opaque;
        c.version = 453;
        for (k, v) in [
            ("consumerGroup", "held-g".to_string()),
            ("topic", "Held".to_string()),
            ("queueId", queue.to_string()),
            ("queueOffset", "0".to_string()),
            ("maxMsgNums", "32".to_string()),
            ("sysFlag", "2".to_string()),
            ("commitOffset", "0".to_string()),
            ("suspendTimeoutMillis", "20000".to_string()),
            ("subscription", "*".to_string()),
            ("subVersion", "0".to_string()),
        ] {
            c.ext_fields.set(k, v);
        }
        let mut out = BytesMut::new();
        encode(&c, &mut out);
        out
    };
    let mut s = TcpStream::connect(addr).await?;
    // Eight held pulls (twice the in-flight limit), then a plain request.
    for q in 0..8 {
        s.write_all(&pull(q, 100 + q as i32)).await?;
    }
    s.write_all(&frame(rq::GET_ALL_TOPIC_CONFIG, 7)).await?;
    let mut buf = BytesMut::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let answer = loop {
        if let Some(c) = decode(&mut buf, DEFAULT_MAX_FRAME)? {
            break c;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read_buf(&mut buf))
            .await
            .map_err(|_| "the request behind held pulls was not answered within 5 s")??;
        if n == 0 {
            return Err("closed".into());
        }
    };
    assert_eq!(answer.opaque, 7, "a pull was answered first: it was not held");
    // A message for one queue answers its held pull at once.
    let m = rokka_store::MessageInput::new("Held", 3, b"hello", b"");
    broker.append_messages(std::slice::from_ref(&m))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let answer = loop {
        if let Some(c) = decode(&mut buf, DEFAULT_MAX_FRAME)? {
            break c;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, s.read_buf(&mut buf)).await?? == 0 {
            return Err("closed".into());
        }
    };
    assert_eq!(answer.opaque, 103, "the pull of queue 3 answered when its message came");
    assert_eq!(answer.code, 0);
    Ok(())
}
