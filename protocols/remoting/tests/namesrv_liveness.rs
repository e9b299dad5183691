//! The name server over TCP: two broker names registered on one address by
//! two connections are two registrations — closing one connection drops
//! exactly the broker registered over it, and UNREGISTER_BROKER drops only
//! the registration it names in full.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rokka_remoting::codes::{request as rq, response as rs};
use rokka_remoting::namesrv::{wire, Registration, TopicConf};
use rokka_remoting::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Client {
    s: TcpStream,
    buf: BytesMut,
    opaque: i32,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Result<Client, Box<dyn std::error::Error>> {
        Ok(Client {
            s: TcpStream::connect(addr).await?,
            buf: BytesMut::new(),
            opaque: 0,
        })
    }

    async fn call(&mut self, mut cmd: RemotingCommand) -> Result<RemotingCommand, Box<dyn std::error::Error>> {
        self.opaque += 1;
        cmd.opaque = self.opaque;
        let mut out = BytesMut::new();
        encode(&cmd, &mut out);
        self.s.write_all(&out).await?;
        loop {
            if let Some(c) = decode(&mut self.buf, DEFAULT_MAX_FRAME)? {
                if c.is_response() && c.opaque == cmd.opaque {
                    return Ok(c);
                }
                continue;
            }
            let read = tokio::time::timeout(Duration::from_secs(5), self.s.read_buf(&mut self.buf)).await??;
            if read == 0 {
                return Err("closed".into());
            }
        }
    }
}

fn registration(name: &str, addr: &str, topic: &str) -> Registration {
    Registration {
        cluster: "DefaultCluster".into(),
        broker_name: name.into(),
        broker_addr: addr.into(),
        broker_id: 0,
        ha_addr: String::new(),
        timeout_ms: None,
        data_version: 1,
        topics: vec![TopicConf {
            name: topic.into(),
            read_queues: 4,
            write_queues: 4,
            perm: 6,
            sys_flag: 0,
        }],
        full: true,
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

async fn route_code(c: &mut Client, topic: &str) -> Result<i32, Box<dyn std::error::Error>> {
    Ok(c.call(req(rq::GET_ROUTEINFO_BY_TOPIC, &[("topic", topic)])).await?.code)
}

#[tokio::test]
async fn one_address_two_broker_names_two_connections() -> TestResult {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let ns_addr = l.local_addr()?;
    let ns = Arc::new(NameServer::new(RocketMqConfig::default(), None));
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, ns, rx));

    // Two brokers claim the same address under two names, each over its own
    // connection; B registers first.
    let shared = "10.0.0.7:10911";
    let mut b = Client::connect(ns_addr).await?;
    let r = b
        .call(wire::to_command(&registration("broker-b", shared, "TopicB"), 0, 453))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    let mut c = Client::connect(ns_addr).await?;
    let r = c
        .call(wire::to_command(&registration("broker-c", shared, "TopicC"), 0, 453))
        .await?;
    assert_eq!(r.code, rs::SUCCESS);
    let mut q = Client::connect(ns_addr).await?;
    assert_eq!(route_code(&mut q, "TopicB").await?, rs::SUCCESS);
    assert_eq!(route_code(&mut q, "TopicC").await?, rs::SUCCESS);

    // B's connection closes: B goes, C stays.
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(5);
    while route_code(&mut q, "TopicB").await? == rs::SUCCESS {
        assert!(
            Instant::now() < deadline,
            "broker-b outlived the connection it registered over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(route_code(&mut q, "TopicB").await?, rs::TOPIC_NOT_EXIST);
    assert_eq!(
        route_code(&mut q, "TopicC").await?,
        rs::SUCCESS,
        "broker-c went with B's connection"
    );
    let info = q.call(req(rq::GET_BROKER_CLUSTER_INFO, &[])).await?;
    let info: serde_json::Value = serde_json::from_slice(&info.body)?;
    assert_eq!(
        info["clusterAddrTable"]["DefaultCluster"],
        serde_json::json!(["broker-c"])
    );

    // An UNREGISTER_BROKER naming C with the wrong id or cluster is ignored;
    // the full key removes it.
    let unregister = |cluster: &str, id: &str| {
        req(
            rq::UNREGISTER_BROKER,
            &[
                ("clusterName", cluster),
                ("brokerName", "broker-c"),
                ("brokerAddr", shared),
                ("brokerId", id),
            ],
        )
    };
    assert_eq!(q.call(unregister("DefaultCluster", "1")).await?.code, rs::SUCCESS);
    assert_eq!(q.call(unregister("OtherCluster", "0")).await?.code, rs::SUCCESS);
    assert_eq!(
        route_code(&mut q, "TopicC").await?,
        rs::SUCCESS,
        "a partial key unregistered C"
    );
    assert_eq!(q.call(unregister("DefaultCluster", "0")).await?.code, rs::SUCCESS);
    assert_eq!(route_code(&mut q, "TopicC").await?, rs::TOPIC_NOT_EXIST);
    drop(c);
    let _ = stop.send(true);
    Ok(())
}

/// rocketmq.namesrv_max_brokers: a new registration beyond it is refused
/// (SYSTEM_ERROR) and not routed; a registered broker's heartbeat still
/// goes through.
#[tokio::test]
async fn registrations_beyond_namesrv_max_brokers_are_refused() -> TestResult {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let ns_addr = l.local_addr()?;
    let cfg = RocketMqConfig {
        namesrv_max_brokers: 2,
        ..RocketMqConfig::default()
    };
    let ns = Arc::new(NameServer::new(cfg, None));
    let (_stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve(l, ns, rx));
    let mut c = Client::connect(ns_addr).await?;
    for (i, want) in [(0, rs::SUCCESS), (1, rs::SUCCESS), (2, rs::SYSTEM_ERROR)] {
        let r = registration(&format!("b{i}"), &format!("10.0.0.{i}:10911"), &format!("T{i}"));
        assert_eq!(c.call(wire::to_command(&r, 0, 453)).await?.code, want, "broker {i}");
    }
    assert_eq!(route_code(&mut c, "T2").await?, rs::TOPIC_NOT_EXIST);
    let again = registration("b1", "10.0.0.1:10911", "T1");
    assert_eq!(c.call(wire::to_command(&again, 0, 453)).await?.code, rs::SUCCESS);
    Ok(())
}
