//! In-process tests of the name server and broker with our own codec (in
//! addition to the real-client suite): route, heartbeat, send, pull with
//! long polling and tag filter, offsets, unknown codes, bad frames.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rokka_broker::{Broker, BrokerConfig};
use rokka_remoting::codes::{request as rq, response as rs};
use rokka_remoting::*;
use rokka_store::record::properties;
use rokka_store::{Entry, MessageInput, MessageStore, StoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Client {
    s: TcpStream,
    buf: BytesMut,
    opaque: i32,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Result<Client, Box<dyn std::error::Error>> {
        Ok(Client {
            s: TcpStream::connect(addr).await?,
            buf: BytesMut::new(),
            opaque: 0,
        })
    }

    async fn send(&mut self, mut cmd: RemotingCommand) -> Result<i32, Box<dyn std::error::Error>> {
        self.opaque += 1;
        cmd.opaque = self.opaque;
        let mut out = BytesMut::new();
        encode(&cmd, &mut out);
        self.s.write_all(&out).await?;
        Ok(cmd.opaque)
    }

    async fn recv(&mut self) -> Result<RemotingCommand, Box<dyn std::error::Error>> {
        loop {
            if let Some(c) = decode(&mut self.buf, DEFAULT_MAX_FRAME)? {
                return Ok(c);
            }
            if self.s.read_buf(&mut self.buf).await? == 0 {
                return Err("closed".into());
            }
        }
    }

    /// Sends and waits for the response with the same opaque (skipping
    /// server-initiated requests).
    async fn call(&mut self, cmd: RemotingCommand) -> Result<RemotingCommand, Box<dyn std::error::Error>> {
        let op = self.send(cmd).await?;
        loop {
            let r = self.recv().await?;
            if r.is_response() && r.opaque == op {
                return Ok(r);
            }
        }
    }
}

fn req(code: i32, ext: &[(&str, &str)]) -> RemotingCommand {
    let mut c = RemotingCommand::request(code, 0);
    c.version = 453;
    for (k, v) in ext {
        c.ext_fields.set(k, *v);
    }
    c
}

/// A broker on a store in `dir`, its RocketMQ port served with `cfg` on a
/// free port: (address, broker, the sender that stops it).
type Served = (std::net::SocketAddr, Arc<Broker>, tokio::sync::watch::Sender<bool>);

async fn serve_broker(dir: &std::path::Path, cfg: RocketMqConfig) -> Result<Served, Box<dyn std::error::Error>> {
    let (addr, broker, _, stop) = serve_processor(dir, cfg).await?;
    Ok((addr, broker, stop))
}

/// [`serve_broker`], with the request processor (for its periodic work).
async fn serve_processor(
    dir: &std::path::Path,
    cfg: RocketMqConfig,
) -> Result<
    (
        std::net::SocketAddr,
        Arc<Broker>,
        Arc<RocketMq>,
        tokio::sync::watch::Sender<bool>,
    ),
    Box<dyn std::error::Error>,
> {
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let rmq = Arc::new(RocketMq::new(Arc::clone(&broker), cfg, addr));
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, Arc::clone(&rmq), rx));
    Ok((addr, broker, rmq, stop))
}

/// A HEART_BEAT of client `id` naming clustering `groups` (no subscriptions).
fn heartbeat_of(id: &str, groups: &[&str]) -> RemotingCommand {
    let consumers: Vec<String> = groups
        .iter()
        .map(|g| format!(r#"{{"groupName":"{g}","messageModel":"CLUSTERING","subscriptionDataSet":[]}}"#))
        .collect();
    let mut h = req(rq::HEART_BEAT, &[]);
    h.body = Bytes::from(format!(
        r#"{{"clientID":"{id}","producerDataSet":[],"consumerDataSet":[{}]}}"#,
        consumers.join(",")
    ));
    h
}

/// A broker and its embedded name server on free ports: (broker, name server, stop).
async fn start_both(
    dir: &std::path::Path,
) -> Result<
    (
        std::net::SocketAddr,
        std::net::SocketAddr,
        tokio::sync::watch::Sender<bool>,
    ),
    Box<dyn std::error::Error>,
> {
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let nl = TcpListener::bind("127.0.0.1:0").await?;
    let ns_addr = nl.local_addr()?;
    let rmq = Arc::new(RocketMq::new(broker, RocketMqConfig::default(), addr));
    let ns = Arc::new(NameServer::new(RocketMqConfig::default(), Some(Arc::clone(&rmq))));
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, rmq, rx.clone()));
    tokio::spawn(serve(nl, ns, rx));
    Ok((addr, ns_addr, tx))
}

async fn start(
    dir: &std::path::Path,
) -> Result<(std::net::SocketAddr, tokio::sync::watch::Sender<bool>), Box<dyn std::error::Error>> {
    let (addr, _, tx) = start_both(dir).await?;
    Ok((addr, tx))
}

fn send_req(topic: &str, queue: i32, body: &str, tags: &str, v2: bool) -> RemotingCommand {
    let props = properties::encode([("TAGS", tags), ("KEYS", "k1"), ("UNIQ_KEY", "ABCDEF0123")]);
    let queue = queue.to_string();
    let mut c = if v2 {
        req(
            rq::SEND_MESSAGE_V2,
            &[
                ("a", "pg"),
                ("b", topic),
                ("c", "TBW102"),
                ("d", "4"),
                ("e", &queue),
                ("f", "0"),
                ("g", "1700000000000"),
                ("h", "0"),
                ("i", &props),
            ],
        )
    } else {
        req(
            rq::SEND_MESSAGE,
            &[
                ("producerGroup", "pg"),
                ("topic", topic),
                ("defaultTopic", "TBW102"),
                ("defaultTopicQueueNums", "4"),
                ("queueId", &queue),
                ("sysFlag", "0"),
                ("bornTimestamp", "1700000000000"),
                ("flag", "0"),
                ("properties", &props),
            ],
        )
    };
    c.body = Bytes::from(body.to_string());
    c
}

fn pull_req(topic: &str, queue: u32, offset: u64, sub: &str, suspend_ms: u64) -> RemotingCommand {
    let (q, o, s) = (queue.to_string(), offset.to_string(), suspend_ms.to_string());
    req(
        rq::PULL_MESSAGE,
        &[
            ("consumerGroup", "cg"),
            ("topic", topic),
            ("queueId", &q),
            ("queueOffset", &o),
            ("maxMsgNums", "32"),
            ("sysFlag", "6"),
            ("commitOffset", "0"),
            ("suspendTimeoutMillis", &s),
            ("subscription", sub),
            ("subVersion", "0"),
            ("expressionType", "TAG"),
        ],
    )
}

fn bodies(r: &RemotingCommand) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= r.body.len() {
        let n = u32::from_be_bytes([r.body[at], r.body[at + 1], r.body[at + 2], r.body[at + 3]]) as usize;
        let rec = r.body.slice(at..at + n);
        if let Ok(Entry::Message(m)) = rokka_store::decode_entry(&rec) {
            out.push(String::from_utf8_lossy(&m.body).into_owned());
        }
        at += n;
    }
    out
}

/// Oneway sends are stored and never answered, with async flush (sent on
/// the connection's task) and sync flush (a task each, waiting for the
/// disk).
#[tokio::test]
async fn oneway_sends_are_stored_and_not_answered() -> TestResult {
    for mode in [rokka_store::FlushMode::Async, rokka_store::FlushMode::Sync] {
        let dir = tempfile::tempdir()?;
        let mut config = StoreConfig::for_tests(dir.path());
        config.flush_mode = mode;
        let store = Arc::new(MessageStore::open(config)?);
        let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let rmq = Arc::new(RocketMq::new(broker, RocketMqConfig::default(), addr));
        let (_stop, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(serve(l, rmq, rx));
        let mut c = Client::connect(addr).await?;
        for (i, v2) in [(0, false), (1, true)] {
            let mut s = send_req("OW", 0, &format!("ow{i}"), "TagA", v2);
            s.flag = FLAG_ONEWAY;
            c.send(s).await?;
        }
        // Every frame back answers a pull: nothing for the sends.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let op = c.send(pull_req("OW", 0, 0, "*", 0)).await?;
            let r = tokio::time::timeout(Duration::from_secs(10), c.recv()).await??;
            assert!(r.is_response() && r.opaque == op, "{mode:?}: {r:?}");
            if bodies(&r).len() == 2 {
                assert_eq!(bodies(&r), vec!["ow0", "ow1"], "{mode:?}");
                break;
            }
            assert!(Instant::now() < deadline, "{mode:?}: oneway sends not stored");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

#[tokio::test]
async fn route_send_pull_offsets() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, ns_addr, _stop) = start_both(dir.path()).await?;
    let mut c = Client::connect(addr).await?;
    let mut ns = Client::connect(ns_addr).await?;
    let r = ns.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", "T1")])).await?;
    assert_eq!(r.code, rs::TOPIC_NOT_EXIST);
    // Route requests belong to the name server port.
    let r = c.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", "TBW102")])).await?;
    assert_eq!(r.code, rs::REQUEST_CODE_NOT_SUPPORTED);
    let r = ns.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", "TBW102")])).await?;
    assert_eq!(r.code, rs::SUCCESS);
    // Sends auto-create the topic with the client's queue count.
    for (i, v2) in [(0, false), (1, true), (2, true)] {
        let r = c
            .call(send_req(
                "T1",
                1,
                &format!("m{i}"),
                if i == 1 { "TagB" } else { "TagA" },
                v2,
            ))
            .await?;
        assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
        assert_eq!(r.ext_fields.get("queueOffset"), Some(i.to_string().as_str()));
        assert_eq!(r.ext_fields.get("queueId"), Some("1"));
        assert_eq!(r.ext_fields.get("msgId").map(str::len), Some(32));
        assert_eq!(r.ext_fields.get("MSG_REGION"), Some("DefaultRegion"));
        assert_eq!(r.ext_fields.get("TRACE_ON"), Some("true"));
    }
    // The topic the send created is routed at once (the embedded broker
    // re-registers before a route is read when its topics changed).
    let r = ns.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", "T1")])).await?;
    let route: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(route["queueDatas"][0]["readQueueNums"], 4);
    assert_eq!(route["brokerDatas"][0]["brokerAddrs"]["0"], addr.to_string());
    // Pull everything, then with a tag filter (untrimmed tokens are trimmed).
    let r = c.call(pull_req("T1", 1, 0, "*", 0)).await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(bodies(&r), vec!["m0", "m1", "m2"]);
    assert_eq!(r.ext_fields.get("nextBeginOffset"), Some("3"));
    assert_eq!(r.ext_fields.get("maxOffset"), Some("3"));
    assert_eq!(r.ext_fields.get("minOffset"), Some("0"));
    assert_eq!(r.ext_fields.get("suggestWhichBrokerId"), Some("0"));
    let r = c.call(pull_req("T1", 1, 0, "TagA ||TagC", 0)).await?;
    assert_eq!(bodies(&r), vec!["m0", "m2"]);
    // Caught up: PULL_NOT_FOUND after the hold; past the end: OFFSET_MOVED.
    let r = c.call(pull_req("T1", 1, 3, "*", 0)).await?;
    assert_eq!(r.code, rs::PULL_NOT_FOUND);
    let r = c.call(pull_req("T1", 1, 9, "*", 0)).await?;
    assert_eq!(r.code, rs::PULL_OFFSET_MOVED);
    assert_eq!(r.ext_fields.get("nextBeginOffset"), Some("3"));
    // Offsets. Nothing committed: a queue that still starts at 0 with its
    // first message in memory starts a new group at 0 (Apache's rule) unless
    // the client says setZeroIfNotFound=false; an empty queue is not found.
    let r = c
        .call(req(
            rq::QUERY_CONSUMER_OFFSET,
            &[("consumerGroup", "g9"), ("topic", "T1"), ("queueId", "1")],
        ))
        .await?;
    assert_eq!((r.code, r.ext_fields.get("offset")), (rs::SUCCESS, Some("0")));
    let r = c
        .call(req(
            rq::QUERY_CONSUMER_OFFSET,
            &[
                ("consumerGroup", "g9"),
                ("topic", "T1"),
                ("queueId", "1"),
                ("setZeroIfNotFound", "false"),
            ],
        ))
        .await?;
    assert_eq!(r.code, rs::QUERY_NOT_FOUND);
    let r = c
        .call(req(
            rq::QUERY_CONSUMER_OFFSET,
            &[("consumerGroup", "g9"), ("topic", "T1"), ("queueId", "0")],
        ))
        .await?;
    assert_eq!(r.code, rs::QUERY_NOT_FOUND, "queue 0 holds nothing");
    let mut up = req(
        rq::UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "g9"),
            ("topic", "T1"),
            ("queueId", "1"),
            ("commitOffset", "2"),
        ],
    );
    up.flag = FLAG_ONEWAY;
    c.send(up).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = c
            .call(req(
                rq::QUERY_CONSUMER_OFFSET,
                &[("consumerGroup", "g9"), ("topic", "T1"), ("queueId", "1")],
            ))
            .await?;
        if r.code == rs::SUCCESS {
            assert_eq!(r.ext_fields.get("offset"), Some("2"));
            break;
        }
        assert!(Instant::now() < deadline, "oneway offset update never applied");
    }
    let r = c
        .call(req(rq::GET_MAX_OFFSET, &[("topic", "T1"), ("queueId", "1")]))
        .await?;
    assert_eq!(r.ext_fields.get("offset"), Some("3"));
    // Unknown codes are answered, the connection stays usable.
    let r = c.call(req(9999, &[])).await?;
    assert_eq!(r.code, rs::REQUEST_CODE_NOT_SUPPORTED);
    let r = c
        .call(req(rq::GET_MIN_OFFSET, &[("topic", "T1"), ("queueId", "1")]))
        .await?;
    assert_eq!(r.ext_fields.get("offset"), Some("0"));
    Ok(())
}

#[tokio::test]
async fn long_poll_wakes_on_append_and_heartbeat_registers_consumers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut admin = Client::connect(addr).await?;
    let r = admin
        .call(req(
            rq::UPDATE_AND_CREATE_TOPIC,
            &[
                ("topic", "LP"),
                ("readQueueNums", "2"),
                ("writeQueueNums", "2"),
                ("perm", "6"),
            ],
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    // A consumer heartbeat, then the consumer list.
    let mut consumer = Client::connect(addr).await?;
    let mut hb = req(rq::HEART_BEAT, &[]);
    hb.body = Bytes::from(
        r#"{"clientID":"c1","producerDataSet":[],"consumerDataSet":[{"groupName":"cg","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{"topic":"LP","subString":"*","expressionType":"TAG"}]}]}"#,
    );
    let r = consumer.call(hb.clone()).await?;
    assert_eq!(r.code, rs::SUCCESS);
    let r = admin
        .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "cg")]))
        .await?;
    let list: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(list["consumerIdList"], serde_json::json!(["c1"]));
    // A second member joining notifies the first on its own connection.
    let mut second = Client::connect(addr).await?;
    hb.body = Bytes::from(String::from_utf8_lossy(&hb.body).replace("\"c1\"", "\"c2\""));
    second.call(hb).await?;
    let notify = tokio::time::timeout(Duration::from_secs(5), consumer.recv()).await??;
    assert_eq!(notify.code, rq::NOTIFY_CONSUMER_IDS_CHANGED);
    assert!(notify.is_oneway());
    assert_eq!(notify.ext_fields.get("consumerGroup"), Some("cg"));
    // A held pull (up to 10 s) is answered as soon as a message lands.
    let op = consumer.send(pull_req("LP", 0, 0, "*", 10_000)).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    let r = admin.call(send_req("LP", 0, "wake", "TagA", true)).await?;
    assert_eq!(r.code, rs::SUCCESS);
    let resp = loop {
        let r = tokio::time::timeout(Duration::from_secs(5), consumer.recv()).await??;
        if r.is_response() && r.opaque == op {
            break r;
        }
    };
    assert_eq!(resp.code, rs::SUCCESS);
    assert_eq!(bodies(&resp), vec!["wake"]);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "woken by the append, not the timeout"
    );
    // An append to another queue does not wake it: the hold runs out.
    let t0 = Instant::now();
    let op = consumer.send(pull_req("LP", 0, 1, "*", 1_000)).await?;
    admin.call(send_req("LP", 1, "other", "TagA", true)).await?;
    let resp = loop {
        let r = tokio::time::timeout(Duration::from_secs(5), consumer.recv()).await??;
        if r.is_response() && r.opaque == op {
            break r;
        }
    };
    assert_eq!(resp.code, rs::PULL_NOT_FOUND);
    assert!(t0.elapsed() >= Duration::from_millis(900));
    Ok(())
}

#[tokio::test]
async fn batch_send_and_bad_frames() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut c = Client::connect(addr).await?;
    let mut body = Vec::new();
    for i in 0..3 {
        let b = format!("batch-{i}");
        let p = properties::encode([("UNIQ_KEY", "U1"), ("TAGS", "T")]);
        let total = 22 + b.len() + p.len();
        body.extend_from_slice(&(total as i32).to_be_bytes());
        body.extend_from_slice(&0i32.to_be_bytes());
        body.extend_from_slice(&0i32.to_be_bytes());
        body.extend_from_slice(&7i32.to_be_bytes());
        body.extend_from_slice(&(b.len() as i32).to_be_bytes());
        body.extend_from_slice(b.as_bytes());
        body.extend_from_slice(&(p.len() as i16).to_be_bytes());
        body.extend_from_slice(p.as_bytes());
    }
    let mut s = req(
        rq::SEND_BATCH_MESSAGE,
        &[
            ("a", "pg"),
            ("b", "B"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "0"),
            ("f", "0"),
            ("g", "1"),
            ("h", "0"),
            ("m", "true"),
        ],
    );
    s.body = Bytes::from(body);
    let r = c.call(s).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(r.ext_fields.get("msgId").map(|m| m.split(',').count()), Some(3));
    let r = c.call(pull_req("B", 0, 0, "*", 0)).await?;
    assert_eq!(bodies(&r), vec!["batch-0", "batch-1", "batch-2"]);
    // An oversized frame closes that connection only.
    let mut bad = TcpStream::connect(addr).await?;
    bad.write_all(&0x7fff_ffffu32.to_be_bytes()).await?;
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), bad.read(&mut b)).await?;
    assert!(matches!(n, Ok(0) | Err(_)));
    let r = c
        .call(req(rq::GET_MAX_OFFSET, &[("topic", "B"), ("queueId", "0")]))
        .await?;
    assert_eq!(r.ext_fields.get("offset"), Some("3"));
    Ok(())
}

/// A name server alone and a broker registering with it over TCP: the route
/// appears with the broker's topics, follows a new topic, and goes when the
/// broker stops (UNREGISTER_BROKER).
#[tokio::test]
async fn external_name_server_registration() -> TestResult {
    let dir = tempfile::tempdir()?;
    let nl = TcpListener::bind("127.0.0.1:0").await?;
    let ns_addr = nl.local_addr()?;
    let ns = Arc::new(NameServer::new(RocketMqConfig::default(), None));
    let (ns_stop, ns_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(nl, ns, ns_rx));

    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    broker.create_topic("Ext", 3)?;
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let cfg = RocketMqConfig {
        namesrv_addr: ns_addr.to_string(),
        broker_name: "broker-x".into(),
        ..RocketMqConfig::default()
    };
    let rmq = Arc::new(RocketMq::new(Arc::clone(&broker), cfg, addr));
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, Arc::clone(&rmq), rx.clone()));
    let registrar = tokio::spawn(registrar::run(rmq, None, rx));

    let mut ns = Client::connect(ns_addr).await?;
    let route_of = |topic: &'static str| req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", topic)]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut r = ns.call(route_of("Ext")).await?;
    while r.code != rs::SUCCESS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        r = ns.call(route_of("Ext")).await?;
    }
    assert_eq!(r.code, rs::SUCCESS, "the broker never registered");
    let route: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(route["queueDatas"][0]["readQueueNums"], 3);
    assert_eq!(route["brokerDatas"][0]["brokerName"], "broker-x");
    assert_eq!(route["brokerDatas"][0]["brokerAddrs"]["0"], addr.to_string());
    let r = ns.call(req(rq::GET_BROKER_CLUSTER_INFO, &[])).await?;
    let info: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(info["clusterAddrTable"]["DefaultCluster"][0], "broker-x");

    // A topic made later is registered without waiting for the 30 s period.
    broker.create_topic("Later", 2)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut r = ns.call(route_of("Later")).await?;
    while r.code != rs::SUCCESS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        r = ns.call(route_of("Later")).await?;
    }
    assert_eq!(r.code, rs::SUCCESS, "a new topic was not registered");

    let _ = stop.send(true);
    registrar.await?;
    let r = ns.call(route_of("Ext")).await?;
    assert_eq!(r.code, rs::TOPIC_NOT_EXIST, "the stopped broker is still routed");
    let _ = ns_stop.send(true);
    Ok(())
}

fn lock_req(code: i32, client: &str, queues: &[i64]) -> RemotingCommand {
    let mq: Vec<serde_json::Value> = queues
        .iter()
        .map(|q| serde_json::json!({"topic": "L", "brokerName": "broker-a", "queueId": q}))
        .collect();
    let mut c = req(code, &[]);
    c.body = Bytes::from(
        serde_json::json!({"consumerGroup": "og", "clientId": client, "onlyThisBroker": false, "mqSet": mq})
            .to_string(),
    );
    c
}

fn locked(r: &RemotingCommand) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    let mut q: Vec<i64> = v["lockOKMQSet"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["queueId"].as_i64())
        .collect();
    q.sort_unstable();
    Ok(q)
}

/// Orderly consumption locks: one holder per queue, renewals, unlock.
#[tokio::test]
async fn queue_locks_grant_one_holder() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut c = Client::connect(addr).await?;
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "a", &[0, 1])).await?;
    assert_eq!(locked(&r)?, vec![0, 1]);
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "b", &[1, 2])).await?;
    assert_eq!(locked(&r)?, vec![2], "queue 1 is a's");
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "a", &[0, 1, 2])).await?;
    assert_eq!(locked(&r)?, vec![0, 1], "a renews its own, not b's");
    let r = c.call(lock_req(rq::UNLOCK_BATCH_MQ, "a", &[1])).await?;
    assert_eq!(r.code, rs::SUCCESS);
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "b", &[1])).await?;
    assert_eq!(locked(&r)?, vec![1]);
    let mut bad = req(rq::LOCK_BATCH_MQ, &[]);
    bad.body = Bytes::from_static(b"not json");
    assert_eq!(c.call(bad).await?.code, rs::SYSTEM_ERROR);
    Ok(())
}

/// Names a broker keeps — groups, client ids, topics — are bounded before
/// a handler sees them: one lock request with a long group and many queues
/// would otherwise keep the group once per queue.
#[tokio::test]
async fn long_group_client_and_topic_names_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut c = Client::connect(addr).await?;
    let long = "g".repeat(256);
    let mq: Vec<serde_json::Value> = (0..64)
        .map(|q| serde_json::json!({"topic": "L", "brokerName": "broker-a", "queueId": q}))
        .collect();
    let mut lock = req(rq::LOCK_BATCH_MQ, &[]);
    lock.body = Bytes::from(serde_json::json!({"consumerGroup": long, "clientId": "c", "mqSet": mq}).to_string());
    let r = c.call(lock).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    assert!(
        r.remark.as_deref().unwrap_or_default().contains("255"),
        "{:?}",
        r.remark
    );
    let mut lock = req(rq::LOCK_BATCH_MQ, &[]);
    lock.body = Bytes::from(
        serde_json::json!({"consumerGroup": "g", "clientId": "c", "mqSet": [{"topic": "a/b", "queueId": 0}]})
            .to_string(),
    );
    assert_eq!(c.call(lock).await?.code, rs::SYSTEM_ERROR, "a topic name with a slash");
    for (code, ext) in [
        (
            rq::UPDATE_CONSUMER_OFFSET,
            vec![
                ("consumerGroup", long.as_str()),
                ("topic", "T"),
                ("queueId", "0"),
                ("commitOffset", "1"),
            ],
        ),
        (
            rq::INVOKE_BROKER_TO_RESET_OFFSET,
            vec![("group", long.as_str()), ("topic", "T"), ("timestamp", "0")],
        ),
        (
            rq::QUERY_CONSUMER_OFFSET,
            vec![("consumerGroup", "g"), ("topic", &*"t".repeat(300)), ("queueId", "0")],
        ),
    ] {
        let r = c.call(req(code, &ext)).await?;
        assert_eq!(r.code, rs::SYSTEM_ERROR, "code {code}");
        assert!(
            r.remark.as_deref().unwrap_or_default().contains("longer than"),
            "{:?}",
            r.remark
        );
    }
    // At the limit a name is served.
    let at = "g".repeat(255);
    let r = c
        .call(req(
            rq::UPDATE_CONSUMER_OFFSET,
            &[
                ("consumerGroup", at.as_str()),
                ("topic", "T"),
                ("queueId", "0"),
                ("commitOffset", "1"),
            ],
        ))
        .await?;
    assert_ne!(
        r.remark.as_deref().unwrap_or_default(),
        "consumerGroup is longer than 255 bytes"
    );
    Ok(())
}

/// The lock table holds live locks only, at most `max_queue_locks`: expired
/// locks go before new ones are granted, and past the cap none is granted.
#[tokio::test]
async fn queue_locks_are_capped_and_expired_ones_dropped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = RocketMqConfig {
        max_queue_locks: 4,
        lock_expiry_ms: 300,
        ..RocketMqConfig::default()
    };
    let (addr, _broker, _stop) = serve_broker(dir.path(), cfg).await?;
    let mut c = Client::connect(addr).await?;
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "a", &[0, 1, 2, 3, 4, 5])).await?;
    assert_eq!(locked(&r)?, vec![0, 1, 2, 3], "at most four locks");
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "b", &[9])).await?;
    assert!(locked(&r)?.is_empty(), "the table is full of live locks");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // a's locks expired: they are dropped, and b gets room.
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "b", &[9, 10, 11, 12, 13])).await?;
    assert_eq!(locked(&r)?, vec![9, 10, 11, 12]);
    Ok(())
}

/// QUERY_MESSAGE by KEYS token and by the client's unique id; VIEW_MESSAGE_BY_ID.
#[tokio::test]
async fn query_by_key_unique_id_and_offset() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut c = Client::connect(addr).await?;
    let r = c.call(send_req("Q", 0, "hello", "T", true)).await?;
    assert_eq!(r.code, rs::SUCCESS);
    let msg_id = r.ext_fields.get("msgId").unwrap_or_default().to_string();
    let q = |key: &str, unique: bool| {
        let mut ext = vec![
            ("topic", "Q"),
            ("key", key),
            ("maxNum", "32"),
            ("beginTimestamp", "0"),
            ("endTimestamp", "99999999999999"),
        ];
        if unique {
            ext.push(("_UNIQUE_KEY_QUERY", "true"));
        }
        req(rq::QUERY_MESSAGE, &ext)
    };
    let r = c.call(q("k1", false)).await?;
    assert_eq!((r.code, bodies(&r)), (rs::SUCCESS, vec!["hello".to_string()]));
    let r = c.call(q("ABCDEF0123", true)).await?;
    assert_eq!((r.code, bodies(&r)), (rs::SUCCESS, vec!["hello".to_string()]));
    let r = c.call(q("nope", false)).await?;
    assert_eq!(r.code, rs::QUERY_NOT_FOUND);
    // The offset message id's last 16 hex digits are the CommitLog offset.
    let phys = i64::from_str_radix(&msg_id[msg_id.len() - 16..], 16)?;
    let r = c
        .call(req(
            rq::VIEW_MESSAGE_BY_ID,
            &[("topic", "Q"), ("offset", &phys.to_string())],
        ))
        .await?;
    assert_eq!((r.code, bodies(&r)), (rs::SUCCESS, vec!["hello".to_string()]));
    let r = c.call(req(rq::VIEW_MESSAGE_BY_ID, &[("offset", "999999")])).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    Ok(())
}

/// A mixed group: Kafka members are listed to RocketMQ clients, a client
/// subscribing to other topics than the Kafka members is refused (but not
/// while the Kafka members' topics are still unknown), and a pull of a
/// queue allocated to a Kafka member gets no messages.
#[tokio::test]
async fn mixed_group_lists_kafka_members_and_refuses_conflicts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.create_topic("MX", 2)?;
    let set = |v: &[&str]| {
        v.iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let hb = |id: &str, topic: &str| {
        let mut h = req(rq::HEART_BEAT, &[]);
        h.body = Bytes::from(format!(
            r#"{{"clientID":"{id}","producerDataSet":[],"consumerDataSet":[{{"groupName":"mg","messageModel":"CLUSTERING","subscriptionDataSet":[{{"topic":"{topic}","subString":"*"}}]}}]}}"#
        ));
        h
    };
    // Kafka member known, its topics not yet: no conflict.
    broker.membership().set_kafka("mg", set(&["zz-kafka"]), set(&[]));
    let mut a = Client::connect(addr).await?;
    assert_eq!(a.call(hb("a-rmq", "MX")).await?.code, rs::SUCCESS);
    broker.membership().set_kafka("mg", set(&["zz-kafka"]), set(&["MX"]));
    let r = a
        .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "mg")]))
        .await?;
    let list: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(list["consumerIdList"], serde_json::json!(["a-rmq", "zz-kafka"]));
    // Two queues over [a-rmq, zz-kafka]: queue 1 is the Kafka member's.
    broker.append_messages(&[MessageInput::new("MX", 1, b"kafka's", b"")])?;
    let mut p = pull_req("MX", 1, 0, "*", 0);
    p.ext_fields.set("consumerGroup", "mg");
    let r = a.call(p).await?;
    assert_eq!((r.code, bodies(&r).len()), (rs::PULL_NOT_FOUND, 0));
    // A client subscribing to another topic is refused with a clear remark.
    let mut b = Client::connect(addr).await?;
    let r = b.call(hb("b-rmq", "Elsewhere")).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    assert!(r
        .remark
        .unwrap_or_default()
        .contains("conflicts with its Kafka members"));
    // Kafka members subscribing to different topics (legal in Kafka): a
    // RocketMQ client whose topics are their union is refused too — let
    // in, each Kafka member's rejoin was refused for differing from it.
    broker
        .membership()
        .set_kafka_differing("mg", set(&["zz-kafka", "zz-kafka2"]), set(&["MX"]), true);
    let mut c = Client::connect(addr).await?;
    let r = c.call(hb("c-rmq", "MX")).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR, "{:?}", r.remark);
    assert!(r.remark.unwrap_or_default().contains("subscribe to different topics"));
    Ok(())
}

/// A RocketMQ client joining a group whose Kafka member still holds its
/// share (by the member's last SyncGroup) does not pull it, nor commit it,
/// until the Kafka member's rebalance has given it up: both read it, and
/// each side's commits undid the other's.
#[tokio::test]
async fn a_partition_a_kafka_member_still_holds_is_not_a_joining_clients_yet() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.create_topic("HX", 2)?;
    let set = |v: &[&str]| {
        v.iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let held = |ps: &[i32]| {
        std::collections::BTreeMap::from([(
            "HX".to_string(),
            ps.iter().copied().collect::<std::collections::BTreeSet<_>>(),
        )])
    };
    broker.membership().set_kafka("hg", set(&["zz-kafka"]), set(&["HX"]));
    // The Kafka member holds both partitions (its assignment before the
    // RocketMQ client came).
    broker.membership().set_kafka_held("hg", held(&[0, 1]));
    let mut h = req(rq::HEART_BEAT, &[]);
    h.body = Bytes::from(
        r#"{"clientID":"a-rmq","producerDataSet":[],"consumerDataSet":[{"groupName":"hg","messageModel":"CLUSTERING","subscriptionDataSet":[{"topic":"HX","subString":"*"}]}]}"#,
    );
    let mut c = Client::connect(addr).await?;
    assert_eq!(c.call(h).await?.code, rs::SUCCESS);
    // Over [a-rmq, zz-kafka] queue 0 is a-rmq's share.
    broker.append_messages(&[MessageInput::new("HX", 0, b"m0", b"")])?;
    let pull = || {
        let mut p = pull_req("HX", 0, 0, "*", 0);
        p.ext_fields.set("consumerGroup", "hg");
        p
    };
    let r = c.call(pull()).await?;
    assert_eq!(bodies(&r).len(), 0, "the Kafka member still holds it");
    let commit = req(
        rq::UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "hg"),
            ("topic", "HX"),
            ("queueId", "0"),
            ("commitOffset", "1"),
        ],
    );
    assert_eq!(c.call(commit).await?.code, rs::SUCCESS);
    assert!(
        broker.store().offsets().get("hg", "HX", 0).is_none(),
        "the commit was not taken"
    );
    // Its rebalance done, the Kafka member holds partition 1 only.
    broker.membership().set_kafka_held("hg", held(&[1]));
    let r = c.call(pull()).await?;
    assert_eq!(bodies(&r), vec!["m0".to_string()]);
    let commit = req(
        rq::UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "hg"),
            ("topic", "HX"),
            ("queueId", "0"),
            ("commitOffset", "1"),
        ],
    );
    assert_eq!(c.call(commit).await?.code, rs::SUCCESS);
    assert_eq!(broker.store().offsets().get("hg", "HX", 0).map(|o| o.offset), Some(1));
    Ok(())
}

/// Heartbeats name clients and groups; both are capped, and a group whose
/// last member left is forgotten (so its slot comes back).
#[tokio::test]
async fn heartbeat_clients_and_groups_are_capped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = RocketMqConfig {
        max_clients: 2,
        max_consumer_groups: 2,
        ..RocketMqConfig::default()
    };
    let (addr, _broker, _stop) = serve_broker(dir.path(), cfg).await?;
    let hb = heartbeat_of;
    let mut c = Client::connect(addr).await?;
    assert_eq!(c.call(hb("c1", &["g1", "g2"])).await?.code, rs::SUCCESS);
    let r = c.call(hb("c2", &["g3"])).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR, "a third group");
    assert!(r.remark.as_deref().unwrap_or_default().contains("max_consumer_groups"));
    let r = c.call(hb("c3", &[])).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR, "a third client");
    assert!(r.remark.as_deref().unwrap_or_default().contains("max_clients"));
    // c1 leaves g2: the group is forgotten and g3 fits.
    let r = c
        .call(req(
            rq::UNREGISTER_CLIENT,
            &[("clientID", "c1"), ("consumerGroup", "g2")],
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(c.call(hb("c2", &["g3"])).await?.code, rs::SUCCESS);
    let r = c
        .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "g3")]))
        .await?;
    let list: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(list["consumerIdList"], serde_json::json!(["c2"]));
    Ok(())
}

/// A group with Kafka consumer-protocol (KIP-848) members has its
/// partitions assigned by the broker: a RocketMQ client, which allocates
/// queues itself, is refused rather than consume them a second time.
#[tokio::test]
async fn a_rocketmq_client_cannot_join_a_consumer_protocol_group() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.membership().add_consumer_protocol_group("k848");
    let mut c = Client::connect(addr).await?;
    let mut hb = req(rq::HEART_BEAT, &[]);
    hb.body = Bytes::from(
        r#"{"clientID":"r1","producerDataSet":[],"consumerDataSet":[{"groupName":"k848","messageModel":"CLUSTERING","subscriptionDataSet":[]},{"groupName":"plain","messageModel":"CLUSTERING","subscriptionDataSet":[]}]}"#,
    );
    let r = c.call(hb).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    assert!(
        r.remark.as_deref().unwrap_or_default().contains("KIP-848"),
        "{:?}",
        r.remark
    );
    for (group, want) in [("k848", serde_json::json!([])), ("plain", serde_json::json!(["r1"]))] {
        let r = c
            .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", group)]))
            .await?;
        let list: serde_json::Value =
            serde_json::from_slice(&r.body).unwrap_or(serde_json::json!({"consumerIdList": []}));
        assert_eq!(list["consumerIdList"], want, "{group}");
    }
    Ok(())
}

/// INVOKE_BROKER_TO_RESET_OFFSET (mqadmin resetOffsetByTime): offsets move
/// backwards only unless forced, to a queue's exact offset, or to the end
/// (timestamp -1); the group's live member is told on its own connection
/// (RESET_CONSUMER_CLIENT_OFFSET with the table); its commits of the old
/// position are then ignored until it commits or pulls at the new one.
#[tokio::test]
async fn offset_reset_tells_the_members_and_holds_off_stale_commits() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut admin = Client::connect(addr).await?;
    let r = admin
        .call(req(
            rq::UPDATE_AND_CREATE_TOPIC,
            &[
                ("topic", "RS"),
                ("readQueueNums", "2"),
                ("writeQueueNums", "2"),
                ("perm", "6"),
            ],
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    for i in 0..10 {
        let r = admin.call(send_req("RS", i % 2, &format!("m{i}"), "T", true)).await?;
        assert_eq!(r.code, rs::SUCCESS);
    }
    let mut member = Client::connect(addr).await?;
    let mut hb = req(rq::HEART_BEAT, &[]);
    hb.body = Bytes::from(
        r#"{"clientID":"m1","producerDataSet":[],"consumerDataSet":[{"groupName":"rg","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{"topic":"RS","subString":"*","expressionType":"TAG"}]}]}"#,
    );
    assert_eq!(member.call(hb).await?.code, rs::SUCCESS);
    let commit = |q: &str, o: &str| {
        req(
            rq::UPDATE_CONSUMER_OFFSET,
            &[
                ("consumerGroup", "rg"),
                ("topic", "RS"),
                ("queueId", q),
                ("commitOffset", o),
            ],
        )
    };
    let committed = |q: &str| {
        req(
            rq::QUERY_CONSUMER_OFFSET,
            &[("consumerGroup", "rg"), ("topic", "RS"), ("queueId", q)],
        )
    };
    for q in ["0", "1"] {
        assert_eq!(member.call(commit(q, "4")).await?.code, rs::SUCCESS);
    }
    let reset = |fields: &[(&str, &str)]| {
        let mut r = req(rq::INVOKE_BROKER_TO_RESET_OFFSET, &[("topic", "RS"), ("group", "rg")]);
        for (k, v) in fields {
            r.ext_fields.set(k, *v);
        }
        r
    };
    // To the end (timestamp -1) without force: nothing moves forward.
    let r = admin.call(reset(&[("timestamp", "-1"), ("isForce", "false")])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert!(body.contains(r#""queueId":0,"topic":"RS"}:4"#), "{body}");
    // The member hears of it on its own connection (oneway).
    let n = tokio::time::timeout(Duration::from_secs(5), member.recv()).await??;
    assert_eq!(n.code, rq::RESET_CONSUMER_CLIENT_OFFSET);
    assert!(n.is_oneway());
    assert_eq!(n.ext_fields.get("group"), Some("rg"));
    assert_eq!(n.ext_fields.get("isForce"), Some("false"));
    assert_eq!(String::from_utf8_lossy(&n.body), body);
    // Queue 1 exactly to 2, forced.
    let r = admin
        .call(reset(&[
            ("timestamp", "0"),
            ("isForce", "true"),
            ("queueId", "1"),
            ("offset", "2"),
        ]))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(r.ext_fields.get("rokkaNotified"), Some("1"));
    let n = tokio::time::timeout(Duration::from_secs(5), member.recv()).await??;
    assert!(String::from_utf8_lossy(&n.body).ends_with(r#""queueId":1,"topic":"RS"}:2}}"#));
    assert_eq!(admin.call(committed("1")).await?.ext_fields.get("offset"), Some("2"));
    // The member, not yet moved, commits its old position: ignored.
    assert_eq!(member.call(commit("1", "4")).await?.code, rs::SUCCESS);
    assert_eq!(admin.call(committed("1")).await?.ext_fields.get("offset"), Some("2"));
    // Its pull at the new offset shows it moved: its commits count again.
    let mut pull = pull_req("RS", 1, 2, "*", 0);
    pull.ext_fields.set("consumerGroup", "rg");
    let r = member.call(pull).await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(member.call(commit("1", "5")).await?.code, rs::SUCCESS);
    assert_eq!(admin.call(committed("1")).await?.ext_fields.get("offset"), Some("5"));
    // Forced to the start of every queue by time (0 = before the first).
    let r = admin.call(reset(&[("timestamp", "0"), ("isForce", "true")])).await?;
    assert_eq!(r.code, rs::SUCCESS);
    for q in ["0", "1"] {
        assert_eq!(admin.call(committed(q)).await?.ext_fields.get("offset"), Some("0"));
    }
    // A commit at the reset offset releases the hold too.
    assert_eq!(member.call(commit("0", "0")).await?.code, rs::SUCCESS);
    assert_eq!(member.call(commit("0", "3")).await?.code, rs::SUCCESS);
    assert_eq!(admin.call(committed("0")).await?.ext_fields.get("offset"), Some("3"));
    // Refusals: no target, an unknown topic, a queue out of range.
    assert_eq!(admin.call(reset(&[("isForce", "true")])).await?.code, rs::SYSTEM_ERROR);
    let mut r = reset(&[("timestamp", "-1"), ("isForce", "true")]);
    r.ext_fields.set("topic", "Nope");
    assert_eq!(admin.call(r).await?.code, rs::TOPIC_NOT_EXIST);
    let r = admin
        .call(reset(&[
            ("timestamp", "0"),
            ("isForce", "true"),
            ("queueId", "7"),
            ("offset", "0"),
        ]))
        .await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    Ok(())
}

/// The broker's own topics (delay levels, timer wheel, transactions) take
/// no client's sends: NO_PERMISSION, as RocketMQ's TopicValidator; nothing
/// is stored there, and a send to a user topic still works.
#[tokio::test]
async fn sends_to_the_brokers_own_topics_are_forbidden() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    let mut c = Client::connect(addr).await?;
    for topic in [
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "rmq_sys_wheel_timer",
        "rmq_sys_timer_op",
    ] {
        for v2 in [false, true] {
            let r = c.call(send_req(topic, 0, "0,1,2,", "d", v2)).await?;
            assert_eq!(r.code, 16, "{topic}: {:?}", r.remark);
            assert!(
                r.remark.as_deref().is_some_and(|m| m.contains("forbidden")),
                "{:?}",
                r.remark
            );
        }
        let stored: u64 = (0..32).map(|q| broker.store().max_offset(topic, q)).sum();
        assert_eq!(stored, 0, "{topic}");
    }
    let r = c.call(send_req("user-topic", 0, "ok", "T", true)).await?;
    assert_eq!(r.code, rs::SUCCESS);
    Ok(())
}

/// With ACLs on, a CommitLog offset names any record: viewing it needs READ
/// on the record's topic, and sending it back into the caller's retry topic
/// READ on the topic it was sent to, not only on the caller's group.
#[tokio::test]
async fn records_named_by_offset_are_read_only_with_read_on_their_topic() -> TestResult {
    use rokka_broker::acl::{Acl, AclSettings, Operation, PatternType, Permission, ResourceType};
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.acls().configure(AclSettings {
        enabled: true,
        max_acls: 100,
        ..AclSettings::default()
    });
    let allow = |rt, name: &str, op| Acl {
        resource_type: rt,
        name: name.into(),
        pattern: PatternType::Literal,
        principal: "User:ANONYMOUS".into(),
        host: "*".into(),
        operation: op,
        permission: Permission::Allow,
    };
    let made = broker.acls().create(vec![
        allow(ResourceType::Topic, "open", Operation::All),
        allow(ResourceType::Group, "g", Operation::Read),
    ]);
    assert!(made.iter().all(|r| r.is_ok()), "{made:?}");
    broker.create_topic("open", 1)?;
    broker.create_topic("secret", 1)?;
    let stored = |topic: &str, body: &'static [u8]| -> Result<u64, Box<dyn std::error::Error>> {
        let input = MessageInput::new(topic, 0, body, b"");
        Ok(broker.append_messages(std::slice::from_ref(&input))?[0].phys_offset)
    };
    let open = stored("open", b"readable")?;
    let secret = stored("secret", b"not yours")?;
    let mut c = Client::connect(addr).await?;
    let view = |phys: u64| req(rq::VIEW_MESSAGE_BY_ID, &[("offset", &phys.to_string())]);
    let r = c.call(view(open)).await?;
    assert_eq!((r.code, bodies(&r)), (rs::SUCCESS, vec!["readable".to_string()]));
    let r = c.call(view(secret)).await?;
    assert_eq!(r.code, 16, "{:?}", r.remark);
    assert!(bodies(&r).is_empty());
    let back = |phys: u64| {
        req(
            rq::CONSUMER_SEND_MSG_BACK,
            &[
                ("group", "g"),
                ("offset", &phys.to_string()),
                ("delayLevel", "0"),
                ("originMsgId", "X"),
            ],
        )
    };
    let r = c.call(back(secret)).await?;
    assert_eq!(r.code, 16, "{:?}", r.remark);
    assert_eq!(broker.store().max_offset("%RETRY%g", 0), 0, "nothing copied");
    let r = c.call(back(open)).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    Ok(())
}

/// With ACLs on, ending a transaction needs WRITE on the topic its half
/// message is bound for, whatever topic the request names (or none).
#[tokio::test]
async fn ending_a_transaction_needs_write_on_its_messages_topic() -> TestResult {
    use rokka_broker::acl::{Acl, AclSettings, Operation, PatternType, Permission, ResourceType};
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    let mut c = Client::connect(addr).await?;
    // A half message for "secret", sent before the ACLs were switched on.
    let props = properties::encode([("TRAN_MSG", "true"), ("PGROUP", "pg"), ("UNIQ_KEY", "TX1")]);
    let mut half = send_req("secret", 0, "pending", "", false);
    half.ext_fields.set("properties", props);
    half.ext_fields.set("sysFlag", "4");
    let r = c.call(half).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let off = r.ext_fields.get("queueOffset").unwrap_or_default().to_string();
    let msg_id = r.ext_fields.get("msgId").unwrap_or_default().to_string();
    let phys = i64::from_str_radix(&msg_id[msg_id.len() - 16..], 16)?.to_string();
    broker.acls().configure(AclSettings {
        enabled: true,
        max_acls: 100,
        ..AclSettings::default()
    });
    let made = broker.acls().create(vec![Acl {
        resource_type: ResourceType::Topic,
        name: "open".into(),
        pattern: PatternType::Literal,
        principal: "User:ANONYMOUS".into(),
        host: "*".into(),
        operation: Operation::All,
        permission: Permission::Allow,
    }]);
    assert!(made.iter().all(|r| r.is_ok()), "{made:?}");
    for topic in [Some("open"), None] {
        let mut ext = vec![
            ("producerGroup", "pg"),
            ("tranStateTableOffset", off.as_str()),
            ("commitLogOffset", phys.as_str()),
            ("commitOrRollback", "8"),
        ];
        ext.extend(topic.map(|t| ("topic", t)));
        let r = c.call(req(rq::END_TRANSACTION, &ext)).await?;
        assert_eq!(r.code, 16, "topic {topic:?}: {:?}", r.remark);
    }
    assert_eq!(broker.store().max_offset("secret", 0), 0, "nothing committed");
    Ok(())
}

/// A held pull whose tag filter matches nothing in a long backlog scans a
/// bounded stretch of it and is answered PULL_RETRY_IMMEDIATELY from where
/// it got to (as RocketMQ's maxFilterMessageCount), not the whole queue in
/// one request; the client's next pull goes on from there.
#[tokio::test]
async fn a_filtered_out_backlog_is_scanned_a_stretch_per_pull() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.create_topic("backlog", 1)?;
    let props = properties::encode([("TAGS", "A")]);
    let inputs: Vec<MessageInput<'_>> = (0..5000)
        .map(|_| MessageInput::new("backlog", 0, b"a", props.as_bytes()))
        .collect();
    for chunk in inputs.chunks(500) {
        broker.append_messages(chunk)?;
    }
    let mut c = Client::connect(addr).await?;
    let mut offset = 0u64;
    let mut pulls = 0;
    loop {
        let r = c.call(pull_req("backlog", 0, offset, "B", 1_000)).await?;
        pulls += 1;
        let next: u64 = r.ext_fields.get("nextBeginOffset").unwrap_or("0").parse()?;
        if r.code == 20 {
            assert!(next > offset, "no progress at {offset}");
            assert!(next - offset <= 17 * 32, "one pull scanned {} entries", next - offset);
            offset = next;
            continue;
        }
        // The end of the backlog: held, then nothing found.
        assert_eq!(r.code, rs::PULL_NOT_FOUND, "{:?}", r.remark);
        break;
    }
    assert!(pulls >= 5000 / (17 * 32), "{pulls} pulls");
    Ok(())
}

/// A SQL92 subscription is refused at the pull (the broker filters by tag
/// only: read as a tag it would silently match nothing), from the request
/// or from the heartbeat; a heartbeat's subscriptions replace the group's,
/// so a topic the consumer dropped is not filtered by its old expression.
#[tokio::test]
async fn sql92_subscriptions_are_refused_and_heartbeats_replace_subscriptions() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.create_topic("t", 1)?;
    let mut c = Client::connect(addr).await?;
    let mut p = pull_req("t", 0, 0, "a > 5", 0);
    p.ext_fields.set("expressionType", "SQL92");
    let r = c.call(p).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    assert!(
        r.remark.as_deref().is_some_and(|m| m.contains("SQL92")),
        "{:?}",
        r.remark
    );
    let heartbeat = |subs: &str| {
        let mut h = req(rq::HEART_BEAT, &[]);
        h.body = Bytes::from(format!(
            r#"{{"clientID":"c1","producerDataSet":[],"consumerDataSet":[{{"groupName":"cg","messageModel":"CLUSTERING","subscriptionDataSet":[{subs}]}}]}}"#
        ));
        h
    };
    // The heartbeat's filter (a pull without the subscription flag).
    let pull_by_heartbeat = || {
        let mut p = pull_req("t", 0, 0, "", 0);
        p.ext_fields.set("sysFlag", "2");
        p
    };
    let r = c
        .call(heartbeat(
            r#"{"topic":"t","subString":"a > 5","expressionType":"SQL92"}"#,
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(c.call(pull_by_heartbeat()).await?.code, rs::SYSTEM_ERROR);
    let r = c
        .call(heartbeat(r#"{"topic":"u","subString":"*","expressionType":"TAG"}"#))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(c.call(pull_by_heartbeat()).await?.code, rs::PULL_NOT_FOUND);
    Ok(())
}

/// A send to a retry topic past the group's maxReconsumeTimes lands in the
/// group's dead-letter topic (as RocketMQ's SendMessageProcessor); within
/// it, in the retry topic; a batch to a retry topic is refused.
#[tokio::test]
async fn retry_sends_past_their_limit_go_to_the_dead_letter_topic() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    let mut c = Client::connect(addr).await?;
    let retry = |times: &str, max: &str| {
        let mut r = send_req("%RETRY%cg", 0, "poison", "T", true);
        r.ext_fields.set("j", times);
        r.ext_fields.set("l", max);
        r
    };
    let r = c.call(retry("3", "16")).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(broker.store().max_offset("%RETRY%cg", 0), 1);
    let r = c.call(retry("17", "16")).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(broker.store().max_offset("%RETRY%cg", 0), 1, "not retried again");
    assert_eq!(broker.store().max_offset("%DLQ%cg", 0), 1);
    assert_eq!(broker.topics().get("%DLQ%cg").map(|t| t.partitions), Some(1));
    let mut b = send_req("%RETRY%cg", 0, "", "T", false);
    b.code = rq::SEND_BATCH_MESSAGE;
    let r = c.call(b).await?;
    assert_eq!(r.code, rs::MESSAGE_ILLEGAL, "{:?}", r.remark);
    Ok(())
}

/// A group holding queue locks (an orderly group) sends to its retry topic
/// only past its own retries: such a send goes to the dead-letter topic
/// even with reconsumeTimes equal to the maximum (clients before RocketMQ
/// 5.1.1 do not raise it), as RocketMQ 5.1.1+ brokers do; once its locks
/// expire, the count decides again.
#[tokio::test]
async fn an_orderly_groups_retry_sends_go_to_the_dead_letter_topic() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = RocketMqConfig {
        lock_expiry_ms: 400,
        ..RocketMqConfig::default()
    };
    let (addr, broker, _stop) = serve_broker(dir.path(), cfg).await?;
    let mut c = Client::connect(addr).await?;
    let retry = || {
        let mut r = send_req("%RETRY%og", 0, "poison", "T", true);
        r.ext_fields.set("j", "16");
        r.ext_fields.set("l", "16");
        r
    };
    // Not locked: at the maximum, still retried.
    let r = c.call(retry()).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(broker.store().max_offset("%RETRY%og", 0), 1);
    // The group locks a queue (lock_req's group is "og").
    let r = c.call(lock_req(rq::LOCK_BATCH_MQ, "a", &[0])).await?;
    assert_eq!(locked(&r)?, vec![0]);
    let r = c.call(retry()).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(broker.store().max_offset("%RETRY%og", 0), 1, "not retried again");
    assert_eq!(broker.store().max_offset("%DLQ%og", 0), 1);
    // Expired locks do not count.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let r = c.call(retry()).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(broker.store().max_offset("%RETRY%og", 0), 2);
    Ok(())
}

/// A client id a live consumer registered on its connection cannot be used
/// from another connection to unlock (or take) its orderly queues.
#[tokio::test]
async fn another_connection_cannot_lock_or_unlock_with_a_live_clients_id() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut owner = Client::connect(addr).await?;
    let mut hb = req(rq::HEART_BEAT, &[]);
    hb.body = Bytes::from_static(
        br#"{"clientID":"victim","producerDataSet":[],"consumerDataSet":[{"groupName":"og","messageModel":"CLUSTERING","subscriptionDataSet":[]}]}"#,
    );
    assert_eq!(owner.call(hb).await?.code, rs::SUCCESS);
    let r = owner.call(lock_req(rq::LOCK_BATCH_MQ, "victim", &[0])).await?;
    assert_eq!(locked(&r)?, vec![0]);
    let mut other = Client::connect(addr).await?;
    let r = other.call(lock_req(rq::UNLOCK_BATCH_MQ, "victim", &[0])).await?;
    assert_eq!(r.code, 16, "{:?}", r.remark);
    let r = other.call(lock_req(rq::LOCK_BATCH_MQ, "victim", &[0])).await?;
    assert_eq!(r.code, 16, "{:?}", r.remark);
    // Still the owner's: another client id cannot take it either.
    let r = other.call(lock_req(rq::LOCK_BATCH_MQ, "thief", &[0])).await?;
    assert_eq!(locked(&r)?, Vec::<i64>::new());
    let r = owner.call(lock_req(rq::LOCK_BATCH_MQ, "victim", &[0])).await?;
    assert_eq!(locked(&r)?, vec![0]);
    Ok(())
}

/// With auto-creation off the dead-letter topic is still made for a retry
/// send past its limit (as send-back makes it), not refused TOPIC_NOT_EXIST.
#[tokio::test]
async fn the_dead_letter_topic_is_made_with_auto_creation_off() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
    let broker = Arc::new(Broker::new(
        store,
        BrokerConfig {
            auto_create_topics: false,
            ..BrokerConfig::default()
        },
    )?);
    broker.create_topic("%RETRY%cg", 1)?;
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let rmq = Arc::new(RocketMq::new(Arc::clone(&broker), RocketMqConfig::default(), addr));
    let (_stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, rmq, rx));
    let mut c = Client::connect(addr).await?;
    let mut r = send_req("%RETRY%cg", 0, "poison", "T", true);
    r.ext_fields.set("j", "17");
    r.ext_fields.set("l", "16");
    let r = c.call(r).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(broker.store().max_offset("%DLQ%cg", 0), 1);
    Ok(())
}

/// Timer properties as Apache's HookUtils takes them: one that is not a
/// number refuses the send (MESSAGE_ILLEGAL); a DELAY level wins over them
/// (the message goes through the schedule topic, not the timer wheel).
#[tokio::test]
async fn a_malformed_timer_is_refused_and_a_delay_level_wins_over_timers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    let mut c = Client::connect(addr).await?;
    let with = |props: &[(&str, &str)]| {
        let mut cmd = send_req("timed", 0, "x", "T", false);
        let mut all = vec![("KEYS", "k1"), ("UNIQ_KEY", "ABCDEF0123")];
        all.extend_from_slice(props);
        cmd.ext_fields.set("properties", properties::encode(all));
        cmd
    };
    let r = c.call(with(&[("TIMER_DELAY_SEC", "soon")])).await?;
    assert_eq!(r.code, 13, "{:?}", r.remark);
    let far = (rokka_store::now_ms() + 3_600_000).to_string();
    let r = c.call(with(&[("DELAY", "1"), ("TIMER_DELIVER_MS", &far)])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let store = broker.store();
    assert_eq!(store.max_offset("rmq_sys_wheel_timer", 0), 0, "not on the timer wheel");
    let scheduled: u64 = (0..32).map(|q| store.max_offset("SCHEDULE_TOPIC_XXXX", q)).sum();
    assert_eq!(scheduled, 1, "through the schedule topic");
    Ok(())
}

/// mqadmin's topic and connection commands: updateTopic with read and
/// write queue counts and a permission (kept, routed, enforced),
/// topicStatus, consumerConnection / producerConnection, topicList -c,
/// brokerStatus, deleteTopic; wipeWritePerm / addWritePerm and the KV
/// configs on the name server.
#[tokio::test]
async fn admin_topic_configs_connections_and_name_server_perms() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, ns_addr, _stop) = start_both(dir.path()).await?;
    let mut admin = Client::connect(addr).await?;
    let mut ns = Client::connect(ns_addr).await?;
    let json = |r: &RemotingCommand| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap_or_default();
    let update = |read: &str, write: &str, perm: &str| {
        req(
            rq::UPDATE_AND_CREATE_TOPIC,
            &[
                ("topic", "AT"),
                ("readQueueNums", read),
                ("writeQueueNums", write),
                ("perm", perm),
            ],
        )
    };
    // Created with 8 read, 4 write queues, read-only.
    assert_eq!(admin.call(update("8", "4", "4")).await?.code, rs::SUCCESS);
    let r = admin.call(req(rq::GET_TOPIC_CONFIG, &[("topic", "AT")])).await?;
    assert_eq!(r.code, rs::SUCCESS);
    let c = json(&r);
    assert_eq!(
        (
            c["readQueueNums"].clone(),
            c["writeQueueNums"].clone(),
            c["perm"].clone()
        ),
        (8.into(), 4.into(), 4.into())
    );
    // Routed as set (the broker re-registers with its name server).
    let mut route = serde_json::Value::Null;
    for _ in 0..50 {
        let r = ns.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", "AT")])).await?;
        route = json(&r);
        if route["queueDatas"][0]["perm"] == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let q = &route["queueDatas"][0];
    assert_eq!(
        (
            q["readQueueNums"].clone(),
            q["writeQueueNums"].clone(),
            q["perm"].clone()
        ),
        (8.into(), 4.into(), 4.into()),
        "{route}"
    );
    // Read-only: sends refused, pulls served.
    let r = admin.call(send_req("AT", 0, "x", "t", false)).await?;
    assert_eq!(r.code, 16, "{:?}", r.remark);
    assert!(r
        .remark
        .as_deref()
        .unwrap_or_default()
        .contains("sending message is forbidden"));
    assert_ne!(admin.call(pull_req("AT", 0, 0, "*", 0)).await?.code, 16);
    // Writable again; then write-only: pulls refused.
    assert_eq!(admin.call(update("8", "8", "6")).await?.code, rs::SUCCESS);
    assert_eq!(admin.call(send_req("AT", 5, "x", "t", false)).await?.code, rs::SUCCESS);
    assert_eq!(admin.call(update("8", "8", "2")).await?.code, rs::SUCCESS);
    let r = admin.call(pull_req("AT", 0, 0, "*", 0)).await?;
    assert_eq!(r.code, 16);
    assert!(r
        .remark
        .as_deref()
        .unwrap_or_default()
        .contains("pulling message is forbidden"));
    assert_eq!(admin.call(update("8", "8", "6")).await?.code, rs::SUCCESS);
    // A smaller read count: every queue stays read (Kafka producers write
    // to all of them); the write count is taken.
    assert_eq!(admin.call(update("4", "4", "6")).await?.code, rs::SUCCESS);
    let c = json(&admin.call(req(rq::GET_TOPIC_CONFIG, &[("topic", "AT")])).await?);
    assert_eq!(
        (c["readQueueNums"].clone(), c["writeQueueNums"].clone()),
        (8.into(), 4.into())
    );
    assert_eq!(admin.call(update("8", "8", "6")).await?.code, rs::SUCCESS);
    // Bad counts are INVALID_PARAMETER; system topics SYSTEM_ERROR (as
    // Apache's "conflict with system topic").
    assert_eq!(admin.call(update("0", "4", "6")).await?.code, 29);
    let r = admin
        .call(req(
            rq::UPDATE_AND_CREATE_TOPIC,
            &[
                ("topic", "SCHEDULE_TOPIC_XXXX"),
                ("readQueueNums", "1"),
                ("writeQueueNums", "1"),
            ],
        ))
        .await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    // topicStatus: every queue, the one written to with its offsets.
    let r = admin.call(req(rq::GET_TOPIC_STATS_INFO, &[("topic", "AT")])).await?;
    assert_eq!(r.code, rs::SUCCESS);
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(text.matches("\"minOffset\"").count(), 8, "{text}");
    let q5 = text
        .split(r#""queueId":5,"topic":"AT"}:"#)
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .unwrap_or_default()
        .to_string();
    assert!(
        q5.contains(r#""maxOffset":1"#) && q5.contains(r#""minOffset":0"#),
        "{text}"
    );
    assert!(!q5.contains(r#""lastUpdateTimestamp":0"#), "{text}");
    let r = admin.call(req(rq::GET_TOPIC_STATS_INFO, &[("topic", "nope")])).await?;
    assert_eq!(r.code, rs::TOPIC_NOT_EXIST);
    // Connections: a consumer and a producer heartbeat.
    let mut hb = req(rq::HEART_BEAT, &[]);
    hb.body = Bytes::from(
        r#"{"clientID":"c9","producerDataSet":[{"groupName":"pg9"}],"consumerDataSet":[{"groupName":"cg9","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{"topic":"AT","subString":"*","expressionType":"TAG"}]}]}"#,
    );
    assert_eq!(admin.call(hb).await?.code, rs::SUCCESS);
    let r = admin
        .call(req(rq::GET_CONSUMER_CONNECTION_LIST, &[("consumerGroup", "cg9")]))
        .await?;
    let c = json(&r);
    assert_eq!(c["connectionSet"][0]["clientId"], "c9", "{c}");
    assert_eq!(c["connectionSet"][0]["language"], "JAVA");
    assert_eq!(c["subscriptionTable"]["AT"]["subString"], "*");
    assert_eq!(c["messageModel"], "CLUSTERING");
    let r = admin
        .call(req(rq::GET_CONSUMER_CONNECTION_LIST, &[("consumerGroup", "none")]))
        .await?;
    assert_eq!(r.code, 206);
    let r = admin
        .call(req(rq::GET_PRODUCER_CONNECTION_LIST, &[("producerGroup", "pg9")]))
        .await?;
    assert_eq!(json(&r)["connectionSet"][0]["clientId"], "c9");
    let r = admin
        .call(req(rq::QUERY_TOPIC_CONSUME_BY_WHO, &[("topic", "AT")]))
        .await?;
    assert_eq!(json(&r)["groupList"], serde_json::json!(["cg9"]));
    let r = admin.call(req(rq::GET_BROKER_RUNTIME_INFO, &[])).await?;
    let t = json(&r);
    assert_eq!(t["table"]["brokerActive"], "true");
    assert!(
        t["table"]["commitLogMaxOffset"]
            .as_str()
            .unwrap_or_default()
            .parse::<u64>()?
            > 0
    );
    // Name server: write permission wiped and added back, KV configs.
    let r = ns
        .call(req(rq::WIPE_WRITE_PERM_OF_BROKER, &[("brokerName", "broker-a")]))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert!(r.ext_fields.get("wipeTopicCount").unwrap_or("0").parse::<u64>()? >= 1);
    let route = json(&ns.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", "AT")])).await?);
    assert_eq!(route["queueDatas"][0]["perm"], 4, "{route}");
    let r = ns
        .call(req(rq::ADD_WRITE_PERM_OF_BROKER, &[("brokerName", "broker-a")]))
        .await?;
    assert!(r.ext_fields.get("addTopicCount").unwrap_or("0").parse::<u64>()? >= 1);
    let route = json(&ns.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", "AT")])).await?);
    assert_eq!(route["queueDatas"][0]["perm"], 6);
    let kv = [
        ("namespace", "ORDER_TOPIC_CONFIG"),
        ("key", "AT"),
        ("value", "broker-a:8"),
    ];
    assert_eq!(ns.call(req(rq::PUT_KV_CONFIG, &kv)).await?.code, rs::SUCCESS);
    let r = ns.call(req(rq::GET_KV_CONFIG, &kv[..2])).await?;
    assert_eq!(r.ext_fields.get("value"), Some("broker-a:8"));
    let r = ns.call(req(rq::GET_KVLIST_BY_NAMESPACE, &kv[..1])).await?;
    assert_eq!(json(&r)["table"]["AT"], "broker-a:8");
    assert_eq!(ns.call(req(rq::DELETE_KV_CONFIG, &kv[..2])).await?.code, rs::SUCCESS);
    assert_eq!(
        ns.call(req(rq::GET_KV_CONFIG, &kv[..2])).await?.code,
        rs::QUERY_NOT_FOUND
    );
    // deleteTopic: gone from the broker; deleting it again succeeds.
    let del = || req(rq::DELETE_TOPIC_IN_BROKER, &[("topic", "AT")]);
    assert_eq!(admin.call(del()).await?.code, rs::SUCCESS);
    assert_eq!(
        admin.call(req(rq::GET_TOPIC_CONFIG, &[("topic", "AT")])).await?.code,
        rs::TOPIC_NOT_EXIST
    );
    assert_eq!(admin.call(del()).await?.code, rs::SUCCESS);
    Ok(())
}

/// A client whose heartbeats stop naming one of its groups (that consumer
/// shut down, its UNREGISTER_CLIENT lost) leaves that group after the
/// client timeout while it stays in the groups it still names — else the
/// group's other members keep handing it queues no one pulls.
#[tokio::test]
async fn a_group_a_live_clients_heartbeats_stop_naming_is_left() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = RocketMqConfig {
        client_timeout_ms: 300,
        ..RocketMqConfig::default()
    };
    let (addr, _broker, rmq, _stop) = serve_processor(dir.path(), cfg).await?;
    let hb = |groups: &[&str]| heartbeat_of("c1", groups);
    let mut c = Client::connect(addr).await?;
    assert_eq!(c.call(hb(&["ga", "gb"])).await?.code, rs::SUCCESS);
    assert_eq!(consumer_ids(&mut c, "ga").await?, serde_json::json!(["c1"]));
    // Only gb from now on, past the timeout.
    for _ in 0..5 {
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        assert_eq!(c.call(hb(&["gb"])).await?.code, rs::SUCCESS);
        rmq.expire_clients();
    }
    assert_ne!(
        consumer_ids(&mut c, "ga").await?,
        serde_json::json!(["c1"]),
        "still a member of ga"
    );
    assert_eq!(consumer_ids(&mut c, "gb").await?, serde_json::json!(["c1"]));
    Ok(())
}

async fn consumer_ids(c: &mut Client, group: &str) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let r = c
        .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", group)]))
        .await?;
    let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    Ok(list["consumerIdList"].clone())
}

/// Members of one group whose subscriptions differ only in their tags (a
/// rolling deploy): the group keeps the expression of the newest
/// subVersion and their heartbeats do not tell the members to rebalance
/// (only a change of topics does), as Apache's ConsumerGroupInfo.
#[tokio::test]
async fn subscriptions_differing_in_tags_keep_the_newest_and_rebalance_no_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut admin = Client::connect(addr).await?;
    let r = admin
        .call(req(
            rq::UPDATE_AND_CREATE_TOPIC,
            &[
                ("topic", "SV"),
                ("readQueueNums", "2"),
                ("writeQueueNums", "2"),
                ("perm", "6"),
            ],
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    let hb = |id: &str, tags: &str, version: i64, topics: &[&str]| {
        let subs: Vec<String> = topics
            .iter()
            .map(|t| format!(r#"{{"topic":"{t}","subString":"{tags}","expressionType":"TAG","subVersion":{version}}}"#))
            .collect();
        let mut h = req(rq::HEART_BEAT, &[]);
        h.body = Bytes::from(format!(
            r#"{{"clientID":"{id}","producerDataSet":[],"consumerDataSet":[{{"groupName":"sv","messageModel":"CLUSTERING","subscriptionDataSet":[{}]}}]}}"#,
            subs.join(",")
        ));
        h
    };
    let mut new = Client::connect(addr).await?;
    let mut old = Client::connect(addr).await?;
    assert_eq!(new.call(hb("new", "B", 2000, &["SV"])).await?.code, rs::SUCCESS);
    assert_eq!(old.call(hb("old", "A", 1000, &["SV"])).await?.code, rs::SUCCESS);
    // The old member joining is a change: the new one is told once.
    let n = tokio::time::timeout(Duration::from_secs(5), new.recv()).await??;
    assert_eq!(n.code, rq::NOTIFY_CONSUMER_IDS_CHANGED);
    for _ in 0..3 {
        assert_eq!(old.call(hb("old", "A", 1000, &["SV"])).await?.code, rs::SUCCESS);
        assert_eq!(new.call(hb("new", "B", 2000, &["SV"])).await?.code, rs::SUCCESS);
    }
    let quiet = tokio::time::timeout(Duration::from_millis(500), new.recv()).await;
    assert!(quiet.is_err(), "told to rebalance by a tag change: {quiet:?}");
    let r = admin
        .call(req(rq::GET_CONSUMER_CONNECTION_LIST, &[("consumerGroup", "sv")]))
        .await?;
    let body: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(body["subscriptionTable"]["SV"]["subString"], "B", "{body}");
    assert_eq!(body["subscriptionTable"]["SV"]["subVersion"], 2000);
    Ok(())
}

/// mqadmin deleteSubGroup (DELETE_SUBSCRIPTIONGROUP): with cleanOffset the
/// group's committed offsets go; without, they stay; the broker's own
/// groups are refused.
#[tokio::test]
async fn delete_subscription_group_cleans_the_groups_offsets() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut c = Client::connect(addr).await?;
    let r = c
        .call(req(
            rq::UPDATE_AND_CREATE_TOPIC,
            &[
                ("topic", "DG"),
                ("readQueueNums", "1"),
                ("writeQueueNums", "1"),
                ("perm", "6"),
            ],
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    let commit = req(
        rq::UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "dg"),
            ("topic", "DG"),
            ("queueId", "0"),
            ("commitOffset", "5"),
        ],
    );
    assert_eq!(c.call(commit).await?.code, rs::SUCCESS);
    let query = || {
        req(
            rq::QUERY_CONSUMER_OFFSET,
            &[
                ("consumerGroup", "dg"),
                ("topic", "DG"),
                ("queueId", "0"),
                ("setZeroIfNotFound", "false"),
            ],
        )
    };
    let r = c
        .call(req(rq::DELETE_SUBSCRIPTIONGROUP, &[("groupName", "dg")]))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(c.call(query()).await?.ext_fields.get("offset"), Some("5"));
    let r = c
        .call(req(
            rq::DELETE_SUBSCRIPTIONGROUP,
            &[("groupName", "dg"), ("cleanOffset", "true")],
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(c.call(query()).await?.code, rs::QUERY_NOT_FOUND);
    let r = c
        .call(req(
            rq::DELETE_SUBSCRIPTIONGROUP,
            &[("groupName", "CID_RMQ_SYS_TRANS"), ("cleanOffset", "true")],
        ))
        .await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    Ok(())
}

/// UNREGISTER_CLIENT for a client live on another connection is refused:
/// anyone could otherwise take members out of a group (and rebalance it)
/// by the ids GET_CONSUMER_LIST_BY_GROUP lists. The client itself leaves.
#[tokio::test]
async fn a_client_is_not_unregistered_from_another_connection() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut member = Client::connect(addr).await?;
    let mut other = Client::connect(addr).await?;
    let mut hb = req(rq::HEART_BEAT, &[]);
    hb.body = Bytes::from(
        r#"{"clientID":"victim","producerDataSet":[],"consumerDataSet":[{"groupName":"ug","messageModel":"CLUSTERING","subscriptionDataSet":[]}]}"#,
    );
    assert_eq!(member.call(hb).await?.code, rs::SUCCESS);
    let leave = || {
        req(
            rq::UNREGISTER_CLIENT,
            &[("clientID", "victim"), ("consumerGroup", "ug")],
        )
    };
    assert_eq!(other.call(leave()).await?.code, rs::NO_PERMISSION);
    let r = other
        .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "ug")]))
        .await?;
    let list: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(list["consumerIdList"], serde_json::json!(["victim"]));
    assert_eq!(member.call(leave()).await?.code, rs::SUCCESS);
    Ok(())
}

/// A prepared transaction message whose delivery time the timer wheel
/// cannot take is refused at its send (MESSAGE_ILLEGAL), as the gRPC
/// service refuses it: accepted, every commit of it failed until the check
/// gave the half message up. One due within the limit is taken.
#[tokio::test]
async fn a_prepared_message_due_past_the_timer_limit_is_refused_at_its_send() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    let mut c = Client::connect(addr).await?;
    let prepared = |secs: &str| {
        let props = properties::encode([
            ("TRAN_MSG", "true"),
            ("PGROUP", "pg"),
            ("TIMER_DELAY_SEC", secs),
            ("UNIQ_KEY", "ABCDEF0123"),
        ]);
        let mut c = req(
            rq::SEND_MESSAGE,
            &[
                ("producerGroup", "pg"),
                ("topic", "TxTimer"),
                ("defaultTopic", "TBW102"),
                ("defaultTopicQueueNums", "4"),
                ("queueId", "0"),
                ("sysFlag", "4"),
                ("bornTimestamp", "1700000000000"),
                ("flag", "0"),
                ("properties", &props),
            ],
        );
        c.body = Bytes::from_static(b"later");
        c
    };
    let far = c.call(prepared(&(30 * 24 * 3600).to_string())).await?;
    assert_eq!(far.code, rs::MESSAGE_ILLEGAL, "{:?}", far.remark);
    let near = c.call(prepared("10")).await?;
    assert_eq!(near.code, rs::SUCCESS, "{:?}", near.remark);
    Ok(())
}

/// The subscriptions kept for live groups have a byte budget
/// (`rocketmq.max_subscription_bytes`): a group whose heartbeat would pass
/// it is refused for that group (each group kept its last heartbeat's
/// topics and expressions of up to 64 KiB); a group that leaves gives its
/// bytes back.
#[tokio::test]
async fn subscriptions_kept_have_a_byte_budget() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = RocketMqConfig {
        max_subscription_bytes: 8_000,
        ..RocketMqConfig::default()
    };
    let (addr, _broker, _stop) = serve_broker(dir.path(), cfg).await?;
    let expr = "T".repeat(3_000);
    let hb = |id: &str, group: &str| {
        let mut h = req(rq::HEART_BEAT, &[]);
        h.body = Bytes::from(format!(
            r#"{{"clientID":"{id}","producerDataSet":[],"consumerDataSet":[{{"groupName":"{group}","messageModel":"CLUSTERING","subscriptionDataSet":[{{"topic":"t","subString":"{expr}","expressionType":"TAG","subVersion":1}}]}}]}}"#
        ));
        h
    };
    let mut c = Client::connect(addr).await?;
    assert_eq!(c.call(hb("c1", "g1")).await?.code, rs::SUCCESS);
    assert_eq!(c.call(hb("c2", "g2")).await?.code, rs::SUCCESS);
    assert_eq!(c.call(hb("c2", "g2")).await?.code, rs::SUCCESS, "the same again fits");
    let r = c.call(hb("c3", "g3")).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR, "a third group's 3 000 bytes");
    assert!(r
        .remark
        .as_deref()
        .unwrap_or_default()
        .contains("max_subscription_bytes"));
    let r = c
        .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "g3")]))
        .await?;
    assert_ne!(r.code, rs::SUCCESS, "g3 not kept: {:?}", r.remark);
    let r = c
        .call(req(
            rq::UNREGISTER_CLIENT,
            &[("clientID", "c1"), ("consumerGroup", "g1")],
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    assert_eq!(c.call(hb("c3", "g3")).await?.code, rs::SUCCESS, "g1's bytes given back");
    Ok(())
}

/// notifyConsumerIdsChangedEnable=false (mqadmin updateSubGroup -a false),
/// as Apache's ConsumerManager honours it: members are not told when one
/// joins by a heartbeat or leaves by unregistering (they rebalance on
/// their own timer); a connection that goes is still told.
#[tokio::test]
async fn a_group_without_id_change_notices_is_told_only_when_a_connection_goes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    let mut admin = Client::connect(addr).await?;
    let topic = [
        ("topic", "NQ"),
        ("readQueueNums", "2"),
        ("writeQueueNums", "2"),
        ("perm", "6"),
    ];
    assert_eq!(
        admin.call(req(rq::UPDATE_AND_CREATE_TOPIC, &topic)).await?.code,
        rs::SUCCESS
    );
    let r = admin
        .call(sub_group_update(
            r#"{"groupName":"quiet","notifyConsumerIdsChangedEnable":false}"#,
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let hb = |id: &str| {
        let mut h = req(rq::HEART_BEAT, &[]);
        h.body = Bytes::from(format!(
            r#"{{"clientID":"{id}","producerDataSet":[],"consumerDataSet":[{{"groupName":"quiet","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{{"topic":"NQ","subString":"*","expressionType":"TAG"}}]}}]}}"#
        ));
        h
    };
    let mut first = Client::connect(addr).await?;
    assert_eq!(first.call(hb("q1")).await?.code, rs::SUCCESS);
    let mut second = Client::connect(addr).await?;
    assert_eq!(second.call(hb("q2")).await?.code, rs::SUCCESS);
    let members = admin
        .call(req(rq::GET_CONSUMER_LIST_BY_GROUP, &[("consumerGroup", "quiet")]))
        .await?;
    let list: serde_json::Value = serde_json::from_slice(&members.body)?;
    assert_eq!(list["consumerIdList"], serde_json::json!(["q1", "q2"]));
    let quiet = Duration::from_millis(500);
    assert!(
        tokio::time::timeout(quiet, first.recv()).await.is_err(),
        "not told of a member joining"
    );
    let leave = req(rq::UNREGISTER_CLIENT, &[("clientID", "q2"), ("consumerGroup", "quiet")]);
    assert_eq!(second.call(leave).await?.code, rs::SUCCESS);
    assert!(
        tokio::time::timeout(quiet, first.recv()).await.is_err(),
        "not told of a member unregistering"
    );
    // A member whose connection goes: told.
    let mut third = Client::connect(addr).await?;
    assert_eq!(third.call(hb("q3")).await?.code, rs::SUCCESS);
    drop(third);
    let notice = tokio::time::timeout(Duration::from_secs(5), first.recv()).await??;
    assert_eq!(notice.code, rq::NOTIFY_CONSUMER_IDS_CHANGED);
    assert_eq!(notice.ext_fields.get("consumerGroup"), Some("quiet"));
    Ok(())
}

fn sub_group_update(body: &'static str) -> RemotingCommand {
    let mut u = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, &[]);
    u.body = Bytes::from_static(body.as_bytes());
    u
}

/// mqadmin updateSubGroup's config is kept and honoured as Apache's
/// broker does: consumption turned off is NO_PERMISSION on pull (until
/// turned on again), broadcasting turned off refuses a broadcasting push
/// consumer's pull, retryMaxTimes bounds the retries of a client that
/// does not send its own limit; GET_SUBSCRIPTIONGROUP_CONFIG (352) answers
/// it, DELETE_SUBSCRIPTIONGROUP forgets it. (Refused before: "not
/// supported"; 352 unanswered.)
#[tokio::test]
async fn a_subscription_group_config_is_kept_and_honoured() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.create_topic("SG", 1)?;
    let mut c = Client::connect(addr).await?;
    assert_eq!(c.call(send_req("SG", 0, "m0", "T", true)).await?.code, rs::SUCCESS);
    let get = |g: &str| req(rq::GET_SUBSCRIPTIONGROUP_CONFIG, &[("group", g)]);
    let r = c.call(get("cg")).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR, "an unknown group: {:?}", r.remark);
    assert_eq!(r.remark.as_deref(), Some("No group in this broker"));

    let r = c
        .call(sub_group_update(
            r#"{"groupName":"cg","consumeEnable":false,"retryMaxTimes":2,"consumeFromMinEnable":false,"groupRetryPolicy":{"type":"CUSTOMIZED"}}"#,
        ))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let r = c.call(get("cg")).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["groupName"], "cg");
    assert_eq!(v["consumeEnable"], false);
    assert_eq!(v["retryMaxTimes"], 2);
    assert_eq!(v["consumeFromMinEnable"], false);
    assert_eq!(v["groupRetryPolicy"]["type"], "CUSTOMIZED");
    let r = c.call(req(rq::GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[])).await?;
    let all: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(all["subscriptionGroupTable"]["cg"]["consumeEnable"], false);

    // Consumption off: the pull is refused, nothing read or committed.
    let r = c.call(pull_req("SG", 0, 0, "*", 0)).await?;
    assert_eq!(r.code, rs::NO_PERMISSION, "{:?}", r.remark);
    assert_eq!(r.remark.as_deref(), Some("subscription group no permission, cg"));
    assert_eq!(r.ext_fields.get("forbiddenType"), Some("2"));
    // Another group reads on.
    let mut other = pull_req("SG", 0, 0, "*", 0);
    other.ext_fields.set("consumerGroup", "cg-other");
    let r = c.call(other).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);

    // retryMaxTimes 2: a retry send past it without the client's own
    // limit goes to the dead letters; with the client's limit, that wins.
    let retry = |times: &str, max: Option<&str>| {
        let mut r = send_req("%RETRY%cg", 0, "poison", "T", true);
        r.ext_fields.set("j", times);
        if let Some(m) = max {
            r.ext_fields.set("l", m);
        }
        r
    };
    assert_eq!(c.call(retry("3", Some("16"))).await?.code, rs::SUCCESS);
    assert_eq!(broker.store().max_offset("%RETRY%cg", 0), 1, "the client's limit");
    assert_eq!(c.call(retry("3", None)).await?.code, rs::SUCCESS);
    assert_eq!(broker.store().max_offset("%RETRY%cg", 0), 1, "the group's limit");
    assert_eq!(broker.store().max_offset("%DLQ%cg", 0), 1);

    // A send-back without the client's limit: the group's retryMaxTimes
    // (0: straight to the dead letters); a group without retry queues
    // drops the message, answered SUCCESS (Apache's answers).
    for body in [
        r#"{"groupName":"sb","retryMaxTimes":0}"#,
        r#"{"groupName":"rq0","retryQueueNums":0}"#,
    ] {
        assert_eq!(c.call(sub_group_update(body)).await?.code, rs::SUCCESS);
    }
    let phys = broker.append_messages(&[MessageInput::new("SG", 0, b"failed", b"")])?[0].phys_offset;
    let back = |group: &str| {
        req(
            rq::CONSUMER_SEND_MSG_BACK,
            &[
                ("group", group),
                ("offset", &phys.to_string()),
                ("delayLevel", "0"),
                ("originMsgId", "X"),
            ],
        )
    };
    // A retry waits in the schedule queue of its delay level (3 + times).
    let delayed = || broker.store().max_offset(rokka_broker::schedule::SCHEDULE_TOPIC, 2);
    assert_eq!(c.call(back("sb")).await?.code, rs::SUCCESS);
    assert_eq!(
        broker.store().max_offset("%DLQ%sb", 0),
        1,
        "the group's retryMaxTimes 0"
    );
    assert_eq!(delayed(), 0);
    assert_eq!(c.call(back("rq0")).await?.code, rs::SUCCESS);
    assert_eq!(delayed(), 0, "no retry queue: dropped");
    assert_eq!(broker.store().max_offset("%DLQ%rq0", 0), 0);
    assert_eq!(c.call(back("cg")).await?.code, rs::SUCCESS);
    assert_eq!(delayed(), 1, "retried later, 0 of 2 reconsumes");
    assert_eq!(broker.store().max_offset("%DLQ%cg", 0), 1);

    // Turned on again: served.
    let r = c
        .call(sub_group_update(r#"{"groupName":"cg","consumeEnable":true}"#))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let r = c.call(pull_req("SG", 0, 0, "*", 0)).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(bodies(&r), vec!["m0".to_string(), "failed".to_string()]);
    // A pull held when consumption is turned off is refused when it wakes,
    // not served what woke it.
    let mut held = Client::connect(addr).await?;
    let op = held.send(pull_req("SG", 0, 2, "*", 10_000)).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = c
        .call(sub_group_update(r#"{"groupName":"cg","consumeEnable":false}"#))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(
        c.call(send_req("SG", 0, "while-off", "T", true)).await?.code,
        rs::SUCCESS
    );
    let resp = loop {
        let r = tokio::time::timeout(Duration::from_secs(5), held.recv()).await??;
        if r.is_response() && r.opaque == op {
            break r;
        }
    };
    assert_eq!(resp.code, rs::NO_PERMISSION, "{:?} {:?}", resp.remark, bodies(&resp));
    assert_eq!(resp.ext_fields.get("forbiddenType"), Some("2"));

    // Broadcasting off (mqadmin's default): a broadcasting push consumer
    // (no subscription in its pull) is refused; a clustering one is not.
    let r = c
        .call(sub_group_update(r#"{"groupName":"bg","consumeBroadcastEnable":false}"#))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let mut h = req(rq::HEART_BEAT, &[]);
    h.body = Bytes::from_static(
        br#"{"clientID":"b1","producerDataSet":[],"consumerDataSet":[{"groupName":"bg","messageModel":"BROADCASTING","subscriptionDataSet":[{"topic":"SG","subString":"*"}]}]}"#,
    );
    assert_eq!(c.call(h).await?.code, rs::SUCCESS);
    let push_pull = |sys: &str| {
        let mut p = pull_req("SG", 0, 0, "*", 0);
        p.ext_fields.set("consumerGroup", "bg");
        p.ext_fields.set("sysFlag", sys);
        p
    };
    let r = c.call(push_pull("2")).await?;
    assert_eq!(r.code, rs::NO_PERMISSION, "{:?}", r.remark);
    assert_eq!(r.ext_fields.get("forbiddenType"), Some("4"));
    let r = c.call(push_pull("6")).await?;
    assert_eq!(r.code, rs::SUCCESS, "a pull carrying its subscription: {:?}", r.remark);
    assert_eq!(c.call(heartbeat_of("b1", &["bg"])).await?.code, rs::SUCCESS);
    let r = c.call(push_pull("2")).await?;
    assert_eq!(r.code, rs::SUCCESS, "clustering now: {:?}", r.remark);

    // Refused as Apache refuses them; the broker's own groups too.
    for (body, why) in [
        (r#"{"groupName":"cg","attributes":{"+k":"v"}}"#, "unsupported key: k"),
        (r#"{"groupName":"cg","retryMaxTimes":"many"}"#, "invalid type"),
        (r#"{"groupName":"CID_RMQ_SYS_TRANS"}"#, "system consumer group"),
    ] {
        let r = c.call(sub_group_update(body)).await?;
        assert_eq!(r.code, rs::SYSTEM_ERROR, "{body}");
        assert!(r.remark.as_deref().unwrap_or_default().contains(why), "{:?}", r.remark);
    }

    // A list (225): kept whole, or nothing of it.
    let mut list = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST, &[]);
    list.body = Bytes::from_static(
        br#"{"groupConfigList":[{"groupName":"l1","retryMaxTimes":4},{"groupName":"l2","consumeEnable":false}]}"#,
    );
    let r = c.call(list).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert_eq!(broker.sub_groups().honoured("l1").retry_max_times, 4);
    assert!(!broker.sub_groups().honoured("l2").consume_enable);
    let mut list = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST, &[]);
    list.body = Bytes::from_static(br#"{"groupConfigList":[{"groupName":"l3"},{"groupName":"%SCHEDULE%"}]}"#);
    let r = c.call(list).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR, "{:?}", r.remark);
    assert!(broker.sub_groups().get("l3").is_none(), "nothing of a refused list");
    // A list is counted as it is read (10 001 tiny values: refused before
    // they are held); no list is nothing to do (Apache's answer).
    let mut long = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST, &[]);
    long.body = Bytes::from(format!(r#"{{"groupConfigList":[{}0]}}"#, "0,".repeat(10_000)));
    let r = c.call(long).await?;
    assert_eq!(r.code, rs::SYSTEM_ERROR);
    assert!(
        r.remark.as_deref().unwrap_or_default().contains("more than 10000"),
        "{:?}",
        r.remark
    );
    let mut none = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST, &[]);
    none.body = Bytes::from_static(br#"{"groupConfigList":null}"#);
    assert_eq!(c.call(none).await?.code, rs::SUCCESS);

    // Deleted: the defaults again (the group still has its offsets here).
    let r = c
        .call(req(rq::DELETE_SUBSCRIPTIONGROUP, &[("groupName", "bg")]))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let r = c.call(get("bg")).await?;
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["consumeBroadcastEnable"], true, "live member: defaults");
    assert!(broker.sub_groups().get("bg").is_none());
    Ok(())
}

/// GET_ALL_SUBSCRIPTIONGROUP_CONFIG lists every group with offsets, and
/// QUERY_TOPIC_CONSUME_BY_WHO every group of a topic: a large offsets table
/// would make answers no RocketMQ client reads (their frames stop at
/// 16 MiB). They stop at 15 MiB, the kept configs first.
#[tokio::test]
async fn the_group_listing_stays_under_a_clients_frame() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    let long = "g".repeat(400);
    for i in 0..40_000 {
        broker.store().offsets().commit(&format!("{long}-{i}"), "T", 0, 1, "");
    }
    let mut c = Client::connect(addr).await?;
    let r = c
        .call(sub_group_update(r#"{"groupName":"zz-kept","retryMaxTimes":2}"#))
        .await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let r = c.call(req(rq::GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert!(r.body.len() < 16 << 20, "{} bytes", r.body.len());
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    let table = v["subscriptionGroupTable"].as_object().ok_or("no table")?;
    assert!(table.len() > 5_000 && table.len() < 40_000, "{} groups", table.len());
    assert_eq!(table["zz-kept"]["retryMaxTimes"], 2, "the kept config first");
    // QUERY_TOPIC_CONSUME_BY_WHO: the topic's groups, as far.
    let r = c.call(req(rq::QUERY_TOPIC_CONSUME_BY_WHO, &[("topic", "T")])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    assert!(r.body.len() < 16 << 20, "{} bytes", r.body.len());
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    let n = v["groupList"].as_array().map_or(0, Vec::len);
    assert!(n > 30_000 && n < 40_000, "{n} groups");
    Ok(())
}

/// The admin's other group and broker views: QUERY_TOPICS_BY_CONSUMER
/// (343, the topics a group committed on, whichever protocol),
/// QUERY_SUBSCRIPTION_BY_CONSUMER (345, from the members' heartbeats) and
/// GET_BROKER_CONFIG (26, Apache's property names). All three were
/// REQUEST_CODE_NOT_SUPPORTED.
#[tokio::test]
async fn the_admins_group_and_broker_views_are_answered() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.store().offsets().commit("vg", "A", 0, 1, "");
    broker.store().offsets().commit("vg", "A", 1, 1, "");
    broker.store().offsets().commit("vg", "B", 0, 1, "");
    broker.store().offsets().commit("vh", "C", 0, 1, "");
    let mut c = Client::connect(addr).await?;
    let r = c.call(req(rq::QUERY_TOPICS_BY_CONSUMER, &[("group", "vg")])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["topicList"], serde_json::json!(["A", "B"]));
    assert_eq!(v["brokerAddr"], addr.to_string());

    let mut h = req(rq::HEART_BEAT, &[]);
    h.body = Bytes::from_static(
        br#"{"clientID":"v1","producerDataSet":[],"consumerDataSet":[{"groupName":"vg","messageModel":"CLUSTERING","subscriptionDataSet":[{"topic":"A","subString":"t1 || t2","expressionType":"TAG","subVersion":77},{"topic":"B","subString":"a > 1","expressionType":"SQL92"}]}]}"#,
    );
    assert_eq!(c.call(h).await?.code, rs::SUCCESS);
    let sub = |g: &str, t: &str| req(rq::QUERY_SUBSCRIPTION_BY_CONSUMER, &[("group", g), ("topic", t)]);
    let r = c.call(sub("vg", "A")).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["subscriptionData"]["subString"], "t1 || t2");
    assert_eq!(v["subscriptionData"]["tagsSet"], serde_json::json!(["t1", "t2"]));
    // Java's String.hashCode of each tag, as Apache's FilterAPI.
    assert_eq!(v["subscriptionData"]["codeSet"], serde_json::json!([3645, 3646]));
    assert_eq!(v["subscriptionData"]["subVersion"], 77);
    let v: serde_json::Value = serde_json::from_slice(&c.call(sub("vg", "C")).await?.body)?;
    assert!(v["subscriptionData"].is_null(), "{v}");

    let r = c.call(req(rq::GET_BROKER_CONFIG, &[])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let props: std::collections::HashMap<String, String> = std::str::from_utf8(&r.body)?
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(props.get("listenPort"), Some(&addr.port().to_string()));
    assert_eq!(props.get("brokerRole").map(String::as_str), Some("ASYNC_MASTER"));
    assert_eq!(props.get("autoCreateTopicEnable").map(String::as_str), Some("true"));
    assert!(r.ext_fields.get("version").is_some());

    // With ACLs on, a group's topics are those the caller may describe
    // (as Kafka's OffsetFetch filters the same table).
    use rokka_broker::acl::{Acl, AclSettings, Operation, PatternType, Permission, ResourceType};
    broker.acls().configure(AclSettings {
        enabled: true,
        max_acls: 100,
        ..AclSettings::default()
    });
    let allow = |rt, name: &str| Acl {
        resource_type: rt,
        name: name.into(),
        pattern: PatternType::Literal,
        principal: "User:ANONYMOUS".into(),
        host: "*".into(),
        operation: Operation::Describe,
        permission: Permission::Allow,
    };
    let made = broker
        .acls()
        .create(vec![allow(ResourceType::Group, "vg"), allow(ResourceType::Topic, "B")]);
    assert!(made.iter().all(|r| r.is_ok()), "{made:?}");
    let r = c.call(req(rq::QUERY_TOPICS_BY_CONSUMER, &[("group", "vg")])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(
        v["topicList"],
        serde_json::json!(["B"]),
        "A is not described to this caller"
    );
    Ok(())
}

/// What the RocketMQ dashboard's topic and consumer pages ask: the name
/// server's "system topics" (cluster and broker names, code 304) and a
/// broker's subscription groups (201); mqadmin updateSubGroup (200) is
/// accepted. All three were answered "not supported", failing both pages.
/// (What a kept config does: `a_subscription_group_config_is_kept_and_honoured`.)
#[tokio::test]
async fn the_dashboards_topic_and_consumer_lists_are_answered() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.create_topic("DT", 1)?;
    broker.store().offsets().commit("dash-g", "DT", 0, 3, "");
    let mut c = Client::connect(addr).await?;
    let r = c.call(req(rq::GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[])).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["subscriptionGroupTable"]["dash-g"]["groupName"], "dash-g");
    assert_eq!(v["subscriptionGroupTable"]["dash-g"]["retryMaxTimes"], 16);
    let mut u = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, &[]);
    u.body = Bytes::from_static(br#"{"groupName":"new-g","retryMaxTimes":16,"consumeEnable":true}"#);
    assert_eq!(c.call(u).await?.code, rs::SUCCESS);
    // What `mqadmin updateSubGroup -g new-g` sends by default: accepted.
    let mut u = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, &[]);
    u.body = Bytes::from_static(
        br#"{"groupName":"new-g","consumeEnable":true,"consumeFromMinEnable":false,"consumeBroadcastEnable":false,"consumeMessageOrderly":false,"retryQueueNums":1,"retryMaxTimes":16,"brokerId":0,"whichBrokerWhenConsumeSlowly":1,"notifyConsumerIdsChangedEnable":true}"#,
    );
    let r = c.call(u).await?;
    assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
    let mut sys = req(rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, &[]);
    sys.body = Bytes::from_static(br#"{"groupName":"%SCHEDULE%"}"#);
    assert_eq!(c.call(sys).await?.code, rs::SYSTEM_ERROR);

    let dir2 = tempfile::tempdir()?;
    let (_b, ns, _stop2) = start_both(dir2.path()).await?;
    let mut n = Client::connect(ns).await?;
    // The broker registers with its name server once started: wait for it.
    let mut names = serde_json::Value::Null;
    for _ in 0..50 {
        let r = n.call(req(rq::GET_SYSTEM_TOPIC_LIST_FROM_NS, &[])).await?;
        assert_eq!(r.code, rs::SUCCESS, "{:?}", r.remark);
        names = serde_json::from_slice(&r.body)?;
        if names["topicList"].as_array().is_some_and(|a| a.len() >= 2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let mut list: Vec<&str> = names["topicList"]
        .as_array()
        .ok_or("no topicList")?
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    list.sort_unstable();
    // The cluster's and the broker's names (Apache's getSystemTopicList),
    // not the registered topics; and no brokerAddr (given one, clients go
    // on to ask the broker for its own system topics).
    assert_eq!(list, vec!["DefaultCluster", "broker-a"], "{names}");
    assert!(names.get("brokerAddr").is_none_or(|a| a.is_null()), "{names}");
    Ok(())
}

/// GET_CONSUME_STATS as Apache answers it: a group with live subscriptions
/// shows only the topics it subscribes to (a topic it left, or one the
/// same group name once consumed through Kafka, is not its lag now); a
/// `topicList` is taken as it is.
#[tokio::test]
async fn consume_stats_follow_the_groups_subscriptions() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    broker.create_topic("CS1", 1)?;
    broker.create_topic("CS2", 1)?;
    broker.store().offsets().commit("csg", "CS1", 0, 0, "");
    broker.store().offsets().commit("csg", "CS2", 0, 0, "");
    let mut c = Client::connect(addr).await?;
    let stats = |extra: &[(&str, &str)]| {
        let mut ext = vec![("consumerGroup", "csg")];
        ext.extend_from_slice(extra);
        req(rq::GET_CONSUME_STATS, &ext)
    };
    let body = |r: &RemotingCommand| String::from_utf8_lossy(&r.body).into_owned();
    let r = c.call(stats(&[])).await?;
    assert!(
        body(&r).contains("CS1") && body(&r).contains("CS2"),
        "no member: every topic"
    );
    let mut h = req(rq::HEART_BEAT, &[]);
    h.body = Bytes::from(
        r#"{"clientID":"cs-1","producerDataSet":[],"consumerDataSet":[{"groupName":"csg","messageModel":"CLUSTERING","subscriptionDataSet":[{"topic":"CS1","subString":"*"}]}]}"#,
    );
    assert_eq!(c.call(h).await?.code, rs::SUCCESS);
    let r = c.call(stats(&[])).await?;
    assert!(body(&r).contains("CS1") && !body(&r).contains("CS2"), "{}", body(&r));
    let r = c.call(stats(&[("topicList", "CS2")])).await?;
    assert!(!body(&r).contains("CS1") && body(&r).contains("CS2"), "{}", body(&r));
    // Another set's Kafka coordinator reading the group's offsets asks for
    // every topic it committed, whatever its RocketMQ members subscribe to.
    let r = c.call(stats(&[("rokkaAllTopics", "true")])).await?;
    assert!(body(&r).contains("CS1") && body(&r).contains("CS2"), "{}", body(&r));
    Ok(())
}

/// UPDATE_AND_CREATE_TOPIC (mqadmin updateTopic) holds the names it makes
/// to Apache's TopicValidator (SYSTEM_ERROR, as Apache answers):
/// [%|a-zA-Z0-9_-], at most 127 characters, not the broker's own nor TBW102 — a
/// '.' the Java producer refuses client-side, TBW102 made a second
/// "TBW102" in the broker's registration. A topic that exists (a Kafka-made
/// "orders.v1") may still be updated.
#[tokio::test]
async fn created_topic_names_follow_apaches_topic_validator() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, broker, _stop) = serve_broker(dir.path(), RocketMqConfig::default()).await?;
    let mut admin = Client::connect(addr).await?;
    let create = |t: &str| {
        req(
            rq::UPDATE_AND_CREATE_TOPIC,
            &[
                ("topic", t),
                ("readQueueNums", "1"),
                ("writeQueueNums", "1"),
                ("perm", "6"),
            ],
        )
    };
    let long = "x".repeat(128);
    for bad in ["orders.v1", "TBW102", "SCHEDULE_TOPIC_XXXX", "rmq_sys_x", long.as_str()] {
        let r = admin.call(create(bad)).await?;
        assert_eq!(r.code, rs::SYSTEM_ERROR, "{bad}: {:?}", r.remark);
    }
    for good in ["orders-v1|x", "x".repeat(127).as_str(), "%RETRY%g"] {
        let r = admin.call(create(good)).await?;
        assert_eq!(r.code, rs::SUCCESS, "{good}: {:?}", r.remark);
    }
    broker.create_topic("kafka.made", 1)?;
    let r = admin.call(create("kafka.made")).await?;
    assert_eq!(r.code, rs::SUCCESS, "an existing topic is updated: {:?}", r.remark);
    Ok(())
}
