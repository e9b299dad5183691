//! Several broker sets: a Kafka group coordinator reads and writes the
//! committed offsets of another set's queues on that set's master, over
//! its RocketMQ broker listener with the codes a RocketMQ consumer uses —
//! so one group has one offset table across sets and protocols. Kafka's
//! commit metadata and leader epoch travel in extra ext fields
//! (`rokkaMetadata`, `rokkaLeaderEpoch`), which RocketMQ peers ignore.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rokka_broker::remote::{RemoteCall, RemoteOffset, RemoteOffsets};
use rokka_broker::Broker;

use crate::codes::{request as rq, response as rs};
use crate::command::RemotingCommand;
use crate::registrar::NsConn;

/// Ext field carrying a forwarded Kafka commit's metadata.
pub const EXT_METADATA: &str = "rokkaMetadata";
/// Ext field carrying a forwarded Kafka commit's leader epoch.
pub const EXT_LEADER_EPOCH: &str = "rokkaLeaderEpoch";
/// Ext field of a DELETE_SUBSCRIPTIONGROUP a Kafka coordinator forwards:
/// only the group's offsets on this set go (the coordinator deletes the
/// group's subscription-group config itself: one table for the cluster).
pub const EXT_OFFSETS_ONLY: &str = "rokkaOffsetsOnly";

/// Ext field of a DELETE_SUBSCRIPTIONGROUP answer: how many offsets went.
pub const EXT_DELETED: &str = "rokkaDeleted";

/// Connections kept to each other node's broker listener: a call that
/// waits (a transaction END waiting for its markers to be durable) holds
/// one, and the others still carry offset commits and reads.
pub const CONNECTIONS_PER_NODE: usize = 4;

/// Up to [`CONNECTIONS_PER_NODE`] kept connections to one address, opened
/// as calls overlap: a call takes a free one, else waits for one in turn.
pub struct Pool {
    conns: Vec<tokio::sync::Mutex<NsConn>>,
    next: std::sync::atomic::AtomicUsize,
}

impl Pool {
    pub fn new(addr: &str, size: usize) -> Pool {
        Pool {
            conns: (0..size.max(1))
                .map(|_| tokio::sync::Mutex::new(NsConn::new(addr)))
                .collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// One request on a free connection (connecting it if needed).
    pub async fn call(&self, cmd: RemotingCommand, timeout: Duration) -> Result<RemotingCommand, String> {
        for c in &self.conns {
            if let Ok(mut conn) = c.try_lock() {
                return conn.call(cmd, timeout).await;
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].lock().await.call(cmd, timeout).await
    }
}

pub struct RemotingOffsets {
    broker: Arc<Broker>,
    /// Kept connections per master address (bounded by the cluster's
    /// nodes: addresses come from their etcd registrations).
    conns: Mutex<HashMap<String, Arc<Pool>>>,
    opaque: AtomicI32,
    timeout: Duration,
}

impl std::fmt::Debug for RemotingOffsets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotingOffsets")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RemotingOffsets {
    pub fn new(broker: Arc<Broker>, timeout: Duration) -> RemotingOffsets {
        RemotingOffsets {
            broker,
            conns: Mutex::new(HashMap::new()),
            opaque: AtomicI32::new(1),
            timeout,
        }
    }

    /// The broker listener of `set`'s master, as the cluster view has it.
    fn master_addr(&self, set: &str) -> Result<String, String> {
        let view = self.broker.cluster_view().ok_or("not in cluster mode")?;
        let s = view.set_named(set).ok_or_else(|| format!("unknown broker set {set}"))?;
        let m = s.master.ok_or_else(|| format!("broker set {set} has no master"))?;
        view.node(m)
            .map(|n| n.broker.clone())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("master {m} of {set} has no broker address"))
    }

    pub(crate) async fn call(&self, set: &str, mut cmd: RemotingCommand) -> Result<RemotingCommand, String> {
        let addr = self.master_addr(set)?;
        // As the cluster's own call, whatever the ACLs say of User:ANONYMOUS.
        crate::auth::sign_as_cluster(&self.broker, &mut cmd);
        let conn = {
            let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            // Addresses of nodes gone from the view are dropped.
            if let Some(view) = self.broker.cluster_view() {
                conns.retain(|a, _| view.nodes.iter().any(|n| &n.broker == a));
            }
            Arc::clone(
                conns
                    .entry(addr.clone())
                    .or_insert_with(|| Arc::new(Pool::new(&addr, CONNECTIONS_PER_NODE))),
            )
        };
        conn.call(cmd, self.timeout).await
    }

    /// A request to another set's master with a fresh opaque.
    pub(crate) fn command(&self, code: i32) -> RemotingCommand {
        let opaque = self.opaque.fetch_add(1, Ordering::Relaxed) & i32::MAX;
        RemotingCommand::request(code, opaque)
    }

    fn request(&self, code: i32, group: &str, topic: &str, queue: u32) -> RemotingCommand {
        let mut cmd = self.command(code);
        cmd.ext_fields.set("consumerGroup", group);
        cmd.ext_fields.set("topic", topic);
        cmd.ext_fields.set("queueId", queue.to_string());
        cmd
    }
}

impl RemoteOffsets for RemotingOffsets {
    fn commit<'a>(
        &'a self,
        set: &'a str,
        group: &'a str,
        topic: &'a str,
        queue: u32,
        committed: RemoteOffset,
    ) -> RemoteCall<'a, ()> {
        Box::pin(async move {
            let mut cmd = self.request(rq::UPDATE_CONSUMER_OFFSET, group, topic, queue);
            cmd.ext_fields.set("commitOffset", committed.offset.to_string());
            if !committed.metadata.is_empty() {
                cmd.ext_fields.set(EXT_METADATA, committed.metadata);
            }
            cmd.ext_fields.set(EXT_LEADER_EPOCH, committed.leader_epoch.to_string());
            let r = self.call(set, cmd).await?;
            if r.code == rs::SUCCESS {
                Ok(())
            } else {
                Err(format!(
                    "{set}: UPDATE_CONSUMER_OFFSET answered {} {}",
                    r.code,
                    r.remark.unwrap_or_default()
                ))
            }
        })
    }

    fn group_offsets<'a>(&'a self, set: &'a str, group: &'a str) -> RemoteCall<'a, Vec<(String, u32, u64)>> {
        Box::pin(async move {
            let opaque = self.opaque.fetch_add(1, Ordering::Relaxed) & i32::MAX;
            let mut cmd = RemotingCommand::request(rq::GET_CONSUME_STATS, opaque);
            cmd.ext_fields.set("consumerGroup", group);
            // Every topic the group committed on, subscribed or not (the
            // Kafka coordinator's view of the group's offsets).
            cmd.ext_fields.set("rokkaAllTopics", "true");
            let r = self.call(set, cmd).await?;
            if r.code != rs::SUCCESS {
                return Err(format!(
                    "{set}: GET_CONSUME_STATS answered {} {}",
                    r.code,
                    r.remark.unwrap_or_default()
                ));
            }
            let stats = parse_consume_stats(&r.body).map_err(|e| format!("{set}: GET_CONSUME_STATS body: {e}"))?;
            Ok(stats
                .into_iter()
                .map(|(q, o)| (q.topic, q.queue_id, o.consumer_offset))
                .collect())
        })
    }

    fn delete_group<'a>(&'a self, set: &'a str, group: &'a str) -> RemoteCall<'a, u64> {
        Box::pin(async move {
            let mut cmd = self.command(rq::DELETE_SUBSCRIPTIONGROUP);
            cmd.ext_fields.set("groupName", group);
            cmd.ext_fields.set("cleanOffset", "true");
            cmd.ext_fields.set(EXT_OFFSETS_ONLY, "true");
            let r = self.call(set, cmd).await?;
            if r.code != rs::SUCCESS {
                return Err(format!(
                    "{set}: DELETE_SUBSCRIPTIONGROUP answered {} {}",
                    r.code,
                    r.remark.unwrap_or_default()
                ));
            }
            Ok(r.ext_fields.get(EXT_DELETED).and_then(|n| n.parse().ok()).unwrap_or(0))
        })
    }

    fn fetch<'a>(
        &'a self,
        set: &'a str,
        group: &'a str,
        topic: &'a str,
        queue: u32,
    ) -> RemoteCall<'a, Option<RemoteOffset>> {
        Box::pin(async move {
            let mut cmd = self.request(rq::QUERY_CONSUMER_OFFSET, group, topic, queue);
            // Kafka's answer for nothing committed is "none", not 0.
            cmd.ext_fields.set("setZeroIfNotFound", "false");
            let r = self.call(set, cmd).await?;
            match r.code {
                rs::SUCCESS => {
                    let offset = r
                        .ext_fields
                        .get("offset")
                        .and_then(|o| o.parse::<u64>().ok())
                        .ok_or_else(|| format!("{set}: QUERY_CONSUMER_OFFSET without an offset"))?;
                    Ok(Some(RemoteOffset {
                        offset,
                        metadata: r.ext_fields.get(EXT_METADATA).unwrap_or_default().to_string(),
                        leader_epoch: r
                            .ext_fields
                            .get(EXT_LEADER_EPOCH)
                            .and_then(|e| e.parse().ok())
                            .unwrap_or(-1),
                    }))
                }
                rs::QUERY_NOT_FOUND => Ok(None),
                code => Err(format!(
                    "{set}: QUERY_CONSUMER_OFFSET answered {code} {}",
                    r.remark.unwrap_or_default()
                )),
            }
        })
    }
}

/// A RocketMQ MessageQueue as the admin bodies write it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageQueue {
    pub broker_name: String,
    pub queue_id: u32,
    pub topic: String,
}

/// One queue's line of GET_CONSUME_STATS (RocketMQ's OffsetWrapper).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OffsetWrapper {
    pub broker_offset: u64,
    pub consumer_offset: u64,
    #[serde(default)]
    pub pull_offset: u64,
    #[serde(default)]
    pub last_timestamp: i64,
}

/// `head`, then `{<MessageQueue>:<value>,..}`, then `tail`: a map whose
/// keys are MessageQueue objects, as RocketMQ's fastjson writes its
/// offset tables (`{{"brokerName":..}:..,..}`, which no JSON parser takes
/// whole).
fn encode_queue_table<V: serde::Serialize>(head: &[u8], table: &[(MessageQueue, V)], tail: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + tail.len() + table.len() * 160);
    out.extend_from_slice(head);
    for (i, (q, v)) in table.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Serializing these plain structs and numbers cannot fail.
        out.extend_from_slice(&serde_json::to_vec(q).unwrap_or_default());
        out.push(b':');
        out.extend_from_slice(&serde_json::to_vec(v).unwrap_or_default());
    }
    out.extend_from_slice(tail);
    out
}

/// GET_CONSUME_STATS's body (RocketMQ's ConsumeStats).
pub fn encode_consume_stats(table: &[(MessageQueue, OffsetWrapper)]) -> Vec<u8> {
    encode_queue_table(br#"{"consumeTps":0.0,"offsetTable":{"#, table, b"}}")
}

/// RESET_CONSUMER_CLIENT_OFFSET's and INVOKE_BROKER_TO_RESET_OFFSET's body
/// (RocketMQ's ResetOffsetBody): `{"offsetTable":{<MessageQueue>:offset,..}}`.
pub fn encode_reset_offsets(table: &[(MessageQueue, u64)]) -> Vec<u8> {
    encode_queue_table(br#"{"offsetTable":{"#, table, b"}}")
}

/// One queue's line of GET_TOPIC_STATS_INFO (RocketMQ's TopicOffset).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicOffset {
    pub min_offset: u64,
    pub max_offset: u64,
    pub last_update_timestamp: i64,
}

/// GET_TOPIC_STATS_INFO's body (RocketMQ's TopicStatsTable).
pub fn encode_topic_stats(table: &[(MessageQueue, TopicOffset)]) -> Vec<u8> {
    encode_queue_table(br#"{"offsetTable":{"#, table, br#"},"topicPutTps":0.0}"#)
}

/// Reads what [`encode_consume_stats`] (or a RocketMQ broker) writes.
pub fn parse_consume_stats(body: &[u8]) -> Result<Vec<(MessageQueue, OffsetWrapper)>, String> {
    const KEY: &[u8] = br#""offsetTable""#;
    let Some(at) = body.windows(KEY.len()).position(|w| w == KEY) else {
        return Ok(Vec::new());
    };
    let mut p = at + KEY.len();
    let skip_ws = |p: &mut usize| {
        while body.get(*p).is_some_and(u8::is_ascii_whitespace) {
            *p += 1;
        }
    };
    let expect = |p: &mut usize, c: u8| -> Result<(), String> {
        skip_ws(p);
        if body.get(*p) == Some(&c) {
            *p += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, *p))
        }
    };
    // One JSON value from `p` on, and where it ended.
    fn value<T: serde::de::DeserializeOwned>(body: &[u8], p: &mut usize) -> Result<T, String> {
        let mut it = serde_json::Deserializer::from_slice(&body[*p..]).into_iter::<T>();
        let v = it
            .next()
            .ok_or_else(|| format!("value expected at byte {}", *p))?
            .map_err(|e| e.to_string())?;
        *p += it.byte_offset();
        Ok(v)
    }
    expect(&mut p, b':')?;
    expect(&mut p, b'{')?;
    let mut out = Vec::new();
    skip_ws(&mut p);
    if body.get(p) == Some(&b'}') {
        return Ok(out);
    }
    loop {
        skip_ws(&mut p);
        let q: MessageQueue = value(body, &mut p)?;
        expect(&mut p, b':')?;
        skip_ws(&mut p);
        let o: OffsetWrapper = value(body, &mut p)?;
        out.push((q, o));
        skip_ws(&mut p);
        match body.get(p) {
            Some(b',') => p += 1,
            Some(b'}') => return Ok(out),
            _ => return Err(format!("expected ',' or '}}' at byte {p}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call kept waiting on one connection does not hold up the next call
    /// to the same address: it goes out on a second connection.
    #[tokio::test]
    async fn a_slow_call_does_not_hold_up_the_next() -> Result<(), Box<dyn std::error::Error>> {
        use bytes::BytesMut;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?.to_string();
        // Answers each request; one with remark "slow" after 3 s.
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = BytesMut::new();
                    loop {
                        while let Ok(Some(req)) = crate::codec::decode(&mut buf, crate::DEFAULT_MAX_FRAME) {
                            if req.ext_fields.get("slow").is_some() {
                                tokio::time::sleep(Duration::from_secs(3)).await;
                            }
                            let mut out = BytesMut::new();
                            crate::codec::encode(&req.response(0, 0), &mut out);
                            if s.write_all(&out).await.is_err() {
                                return;
                            }
                        }
                        match s.read_buf(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                });
            }
        });
        let pool = Arc::new(Pool::new(&addr, 2));
        let mut slow = RemotingCommand::request(1, 1);
        slow.ext_fields.set("slow", "1");
        let p = Arc::clone(&pool);
        let waiting = tokio::spawn(async move { p.call(slow, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        let r = pool
            .call(RemotingCommand::request(1, 2), Duration::from_secs(10))
            .await?;
        assert_eq!(r.opaque, 2);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "answered beside the slow call"
        );
        assert_eq!(waiting.await??.opaque, 1);
        // With one connection the second call waits for the first.
        let single = Arc::new(Pool::new(&addr, 1));
        let mut slow = RemotingCommand::request(1, 3);
        slow.ext_fields.set("slow", "1");
        let p = Arc::clone(&single);
        let waiting = tokio::spawn(async move { p.call(slow, Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        single
            .call(RemotingCommand::request(1, 4), Duration::from_secs(10))
            .await?;
        assert!(started.elapsed() >= Duration::from_secs(2));
        waiting.await??;
        Ok(())
    }

    #[test]
    fn consume_stats_round_trip_with_object_keys() {
        let row = |t: &str, q: u32, c: u64| {
            (
                MessageQueue {
                    broker_name: "set-b".into(),
                    queue_id: q,
                    topic: t.into(),
                },
                OffsetWrapper {
                    broker_offset: 100,
                    consumer_offset: c,
                    pull_offset: c,
                    last_timestamp: 0,
                },
            )
        };
        let table = vec![row("a", 0, 5), row("b:{}", 3, 7)];
        let body = encode_consume_stats(&table);
        let text = String::from_utf8_lossy(&body).into_owned();
        assert!(
            text.contains(r#""offsetTable":{{"brokerName":"set-b","queueId":0,"topic":"a"}:{"#),
            "{text}"
        );
        assert_eq!(parse_consume_stats(&body), Ok(table));
        assert_eq!(parse_consume_stats(&encode_consume_stats(&[])), Ok(vec![]));
        // As a RocketMQ broker may space it.
        let spaced = br#"{ "offsetTable" : { {"brokerName":"x","queueId":1,"topic":"t"} : {"brokerOffset":3,"consumerOffset":2,"lastTimestamp":9} } , "consumeTps":1.5}"#;
        let got = parse_consume_stats(spaced).map(|v| {
            v.into_iter()
                .map(|(q, o)| (q.queue_id, o.consumer_offset))
                .collect::<Vec<_>>()
        });
        assert_eq!(got, Ok(vec![(1, 2)]));
        // Damaged bodies are errors, never a panic.
        for bad in [
            &br#"{"offsetTable":{{"brokerName":"x"}"#[..],
            br#"{"offsetTable":{"k":1}}"#,
            br#"{"offsetTable""#,
            br#"{"offsetTable":{{"brokerName":"x","queueId":1,"topic":"t"}:{"brokerOffset":3,"consumerOffset":2}"#,
        ] {
            assert!(parse_consume_stats(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
