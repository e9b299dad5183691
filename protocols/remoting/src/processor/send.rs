//! Sends: single, batch and send-back (retry / DLQ) messages.

use super::*;

/// The requester's client id a request of request/reply carries.
const REPLY_TO_CLIENT: &str = "REPLY_TO_CLIENT";

impl RocketMq {
    /// SEND_REPLY_MESSAGE(_V2), request/reply: the responder's reply goes to
    /// the requester's connection (PUSH_REPLY_MESSAGE_TO_CLIENT, found by
    /// the REPLY_TO_CLIENT client id the request carried), as Apache's
    /// ReplyMessageProcessor does. It is not stored (Apache's
    /// storeReplyMessageEnable off): nothing reads `<cluster>_REPLY_TOPIC`.
    pub(super) fn send_reply(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let props = ext(req, "properties", "i").unwrap_or_default();
        let Some(to) = rokka_store::record::properties::get(props.as_bytes(), REPLY_TO_CLIENT)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(String::from)
        else {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("reply message properties[{REPLY_TO_CLIENT}] is null")),
            );
        };
        let target = self
            .clients()
            .clients
            .get(&to)
            .filter(|cl| !cl.conn.is_closed())
            .map(|cl| cl.conn.clone());
        let Some(target) = target else {
            metrics::counter!("rokka_rocketmq_replies_total", "result" => "no_requester").increment(1);
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("push reply message fail, channel of <{to}> not found.")),
            );
        };
        let field = |long: &str, short: &str, default: &str| ext(req, long, short).unwrap_or(default).to_string();
        let queue = ext_i64(req, "queueId", "e").unwrap_or(0).max(0);
        let mut n = RemotingCommand::request(rq::PUSH_REPLY_MESSAGE_TO_CLIENT, target.next_opaque());
        n.version = self.config.server_version;
        n.ext_fields.set("producerGroup", field("producerGroup", "a", ""));
        n.ext_fields.set("topic", field("topic", "b", ""));
        n.ext_fields.set("defaultTopic", field("defaultTopic", "c", "TBW102"));
        n.ext_fields
            .set("defaultTopicQueueNums", field("defaultTopicQueueNums", "d", "4"));
        n.ext_fields.set("queueId", queue.to_string());
        n.ext_fields.set("sysFlag", field("sysFlag", "f", "0"));
        n.ext_fields.set("bornTimestamp", field("bornTimestamp", "g", "0"));
        n.ext_fields.set("flag", field("flag", "h", "0"));
        let now = rokka_store::now_ms();
        n.ext_fields
            .set("properties", format!("{props}PUSH_REPLY_TIME\u{1}{now}\u{2}"));
        n.ext_fields.set("reconsumeTimes", field("reconsumeTimes", "j", "0"));
        n.ext_fields.set("unitMode", field("unitMode", "k", "false"));
        let born = std::net::SocketAddr::new(conn.peer.ip().to_canonical(), conn.peer.port());
        n.ext_fields.set("bornHost", born.to_string());
        n.ext_fields.set("storeHost", self.store_host.to_string());
        n.ext_fields.set("storeTimestamp", now.to_string());
        n.body = req.body.clone();
        if !target.send(n) {
            metrics::counter!("rokka_rocketmq_replies_total", "result" => "push_failed").increment(1);
            return self.reply(req, rs::SYSTEM_ERROR, Some(format!("push reply message to {to} fail.")));
        }
        metrics::counter!("rokka_rocketmq_replies_total", "result" => "pushed").increment(1);
        let mut r = self.reply(req, rs::SUCCESS, None);
        // As Apache: zeros, so clients decode the answer.
        r.ext_fields.set("msgId", "0");
        r.ext_fields.set("queueId", queue.to_string());
        r.ext_fields.set("queueOffset", "0");
        r
    }

    /// Stores the messages of a send; the response and the CommitLog end to
    /// be durable before it goes out (0 on error).
    pub(super) fn send(&self, req: &RemotingCommand, conn: &Conn) -> (RemotingCommand, u64) {
        match self.send_inner(req, conn) {
            Ok(ok) => ok,
            Err(r) => (r, 0),
        }
    }

    pub(super) fn send_inner(
        &self,
        req: &RemotingCommand,
        conn: &Conn,
    ) -> Result<(RemotingCommand, u64), RemotingCommand> {
        let Some(topic) = ext(req, "topic", "b").map(String::from) else {
            return Err(self.reply(req, rs::MESSAGE_ILLEGAL, Some("topic missing".into())));
        };
        if rokka_broker::is_send_forbidden_topic(&topic) {
            return Err(self.reply(
                req,
                crate::auth::NO_PERMISSION,
                Some(format!("Sending message to topic[{topic}] is forbidden.")),
            ));
        }
        let batch = req.code == rq::SEND_BATCH_MESSAGE || ext_bool(req, "batch", "m");
        let reconsume = ext_i64(req, "reconsumeTimes", "j")
            .unwrap_or(0)
            .clamp(0, i64::from(i32::MAX)) as i32;
        // A retry topic's sends (a consumer's re-send after a failed
        // send-back, an orderly consumer past its retries): past the
        // group's maxReconsumeTimes the message goes to its dead-letter
        // topic, with no delay, as RocketMQ's SendMessageProcessor does —
        // else a poison message loops through the retry topic for ever.
        // So does any such send of a group holding queue locks (an orderly
        // group, RocketMQ 5.1.1+): its consumers retry locally and send
        // back only past their maximum, with the count not raised by
        // clients before 5.1.1 (equal to the maximum, not past it).
        let mut dlq_group = None;
        if let Some(g) = topic.strip_prefix("%RETRY%") {
            if batch {
                return Err(self.reply(
                    req,
                    rs::MESSAGE_ILLEGAL,
                    Some(format!("batch request does not support retry group {topic}")),
                ));
            }
            // The client's limit; else the group's retryMaxTimes (Apache's order).
            let max = ext_i64(req, "maxReconsumeTimes", "l")
                .unwrap_or_else(|| i64::from(self.broker.sub_groups().honoured(g).retry_max_times));
            if i64::from(reconsume) > max || self.group_holds_locks(g) {
                dlq_group = Some(g.to_string());
            }
        }
        let topic = match &dlq_group {
            Some(g) => format!("%DLQ%{g}"),
            None => topic,
        };
        if dlq_group.is_some() && self.broker.topics().get(&topic).is_none_or(|t| t.partitions == 0) {
            // Made whatever auto-creation says, as send-back makes it (and
            // RocketMQ's createTopicInSendMessageBackMethod), on this set.
            if let Err(e) = self.broker.ensure_own_topic(&topic, 1) {
                return Err(self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string())));
            }
        }
        let want_queues = if dlq_group.is_some() {
            1
        } else {
            ext_i64(req, "defaultTopicQueueNums", "d")
                .unwrap_or(4)
                .clamp(1, i64::from(self.config.max_auto_create_queues.max(1))) as u32
        };
        // Made for the send only with CREATE (on the topic or the
        // cluster), as QueryRoute and Kafka's Metadata make a topic.
        // (Asked only for a topic that is not there: the principal comes
        // from the request's signature, which `check` already verified
        // once — not verified again on every send.)
        let may_create = !self.broker.acls().enabled()
            || self.broker.topics().get(&topic).is_some()
            || crate::auth::may(
                &self.broker,
                crate::auth::principal_of(&self.broker, conn, req).as_deref(),
                conn.peer.ip(),
                (
                    rokka_broker::acl::ResourceType::Topic,
                    topic.as_str(),
                    rokka_broker::acl::Operation::Create,
                ),
            );
        let info = match self.broker.topic_or_create(&topic, may_create, Some(want_queues)) {
            Ok(Some(t)) => t,
            Ok(None) => {
                return Err(self.reply(
                    req,
                    rs::TOPIC_NOT_EXIST,
                    Some(format!("topic[{topic}] not exist, apply first please!")),
                ))
            }
            // Apache: a topic that cannot be made is TOPIC_NOT_EXIST, a bad
            // name INVALID_PARAMETER; passing conditions (a cluster not
            // ready, another set's master unreachable) are SYSTEM_ERROR —
            // each of them retried by clients, MESSAGE_ILLEGAL is not (nor
            // SYSTEM_BUSY by the Java client before 5.3: its
            // retryResponseCodes are 17, 14, 1, 16, 204, 205).
            Err(e) => {
                let code = match &e {
                    rokka_broker::BrokerError::Store(rokka_store::StoreError::InvalidTopic(_)) => rs::INVALID_PARAMETER,
                    e if e.is_transient() => rs::SYSTEM_ERROR,
                    _ => rs::TOPIC_NOT_EXIST,
                };
                return Err(self.reply(req, code, Some(e.to_string())));
            }
        };
        // A topic whose permission an admin made read-only (updateTopic
        // -p 4, updateTopicPerm): Apache's msgCheck.
        if !info.rocketmq_writable() {
            return Err(self.reply(
                req,
                rs::NO_PERMISSION,
                Some(format!("the topic[{topic}] sending message is forbidden")),
            ));
        }
        let mut queue = if dlq_group.is_some() {
            0
        } else {
            ext_i64(req, "queueId", "e").unwrap_or(-1)
        };
        if queue < 0 {
            queue = i64::from(rand::random::<u32>() % info.partitions.max(1));
        }
        if queue >= i64::from(info.partitions) {
            return Err(self.reply(
                req,
                rs::INVALID_PARAMETER,
                Some(format!("queueId {queue} out of range for {topic}")),
            ));
        }
        let sys_flag = ext_i64(req, "sysFlag", "f").unwrap_or(0) as i32;
        let born = ext_i64(req, "bornTimestamp", "g").unwrap_or_else(rokka_store::now_ms);
        let flag = ext_i64(req, "flag", "h").unwrap_or(0) as i32;
        let mut props = ext(req, "properties", "i").unwrap_or_default().to_string();
        // A request of request/reply: its responder's reply names the
        // cluster it came through (Apache stamps CLUSTER on every message;
        // only a request's is ever read, by MessageUtil.createReplyMessage).
        if !batch
            && rokka_store::record::properties::get(props.as_bytes(), REPLY_TO_CLIENT).is_some()
            && rokka_store::record::properties::get(props.as_bytes(), "CLUSTER").is_none()
        {
            props.push_str("CLUSTER\u{1}");
            props.push_str(&self.config.cluster_name);
            props.push('\u{2}');
        }
        if let Some(g) = &dlq_group {
            // Dead letters wait for no one: no delay level, no timer.
            let kept = rokka_broker::schedule::without(
                props.as_bytes(),
                &[
                    rokka_broker::schedule::DELAY,
                    "TIMER_DELAY_SEC",
                    "TIMER_DELAY_MS",
                    "TIMER_DELIVER_MS",
                    "__STARTDELIVERTIME",
                ],
            );
            props = String::from_utf8_lossy(&kept).into_owned();
            metrics::counter!("rokka_rocketmq_dlq_messages_total", "group" => g.clone()).increment(1);
        }
        // DELAY=n (single sends only, as RocketMQ), read once.
        let level = if batch {
            None
        } else {
            rokka_broker::schedule::delay_level(props.as_bytes())
        };
        if level.is_some()
            && rokka_broker::timer::TIMER_PROPERTIES[..3]
                .iter()
                .any(|k| rokka_store::record::properties::get(props.as_bytes(), k).is_some())
        {
            // A delay level wins over the timer properties, which are
            // dropped (Apache's HookUtils.checkIfTimerMessage).
            let kept = rokka_broker::schedule::without(props.as_bytes(), &rokka_broker::timer::TIMER_PROPERTIES[..3]);
            props = String::from_utf8_lossy(&kept).into_owned();
        }
        // Owned parts of each message, then borrowed inputs.
        let parts: Vec<(i32, Bytes, String)> = if batch {
            match split_batch(&req.body) {
                Some(p) => p,
                None => return Err(self.reply(req, rs::MESSAGE_ILLEGAL, Some("malformed batch body".into()))),
            }
        } else {
            vec![(flag, req.body.clone(), props)]
        };
        let born_host = std::net::SocketAddr::new(conn.peer.ip().to_canonical(), conn.peer.port());
        let inputs: Vec<MessageInput<'_>> = parts
            .iter()
            .map(|(f, body, p)| MessageInput {
                topic: &topic,
                queue_id: queue as u32,
                flag: *f,
                body,
                properties: p.as_bytes(),
                sys_flag: if batch { 0 } else { sys_flag },
                born_timestamp: born,
                // An IPv4 client on a dual-stack listener is stored as
                // IPv4 (8 bytes, no BORNHOST_V6 flag), as Apache's broker
                // sees it, not as ::ffff:a.b.c.d.
                born_host,
                reconsume_times: reconsume,
                prepared_transaction_offset: 0,
            })
            .collect();
        // A compacted topic keeps the latest message per key: a message
        // without KEYS has nothing to be kept by (Kafka refuses keyless
        // records on compacted topics too).
        if self.broker.store().is_compacted(&topic)
            && parts
                .iter()
                .any(|(_, _, p)| !rokka_broker::convert::has_key(p.as_bytes()))
        {
            metrics::counter!("rokka_rocketmq_messages_refused_total", "reason" => "no_key").increment(1);
            return Err(self.reply(
                req,
                rs::MESSAGE_ILLEGAL,
                Some(format!(
                    "topic {topic} is compacted (cleanup.policy=compact): every message needs KEYS"
                )),
            ));
        }
        // Through the schedule topic (whose own re-puts carry DELAY as state).
        let delay = level.filter(|_| topic != rokka_broker::schedule::SCHEDULE_TOPIC);
        // A prepared transaction message waits as a half message.
        let prepared = !batch
            && sys_flag & rokka_store::record::message::sysflag::TRANSACTION_MASK
                == rokka_store::record::message::sysflag::TRANSACTION_PREPARED;
        // Timer messages (TIMER_DELAY_SEC / _MS, TIMER_DELIVER_MS,
        // __STARTDELIVERTIME); one that is not a number is refused (as
        // Apache, which checks only what is not a prepared transaction).
        let timer = if batch {
            None
        } else if prepared {
            // A prepared message with a delivery time waits in the timer
            // wheel once committed: one the wheel cannot take is refused
            // now (as the gRPC service does), not accepted and then never
            // committable (each commit failed until the check gave it up).
            let due = rokka_broker::timer::requested_time(parts[0].2.as_bytes(), rokka_store::now_ms());
            if let Ok(Some(due)) = due {
                if let Err(e) = self.broker.check_timer_due(due) {
                    return Err(self.reply(req, rs::MESSAGE_ILLEGAL, Some(e.to_string())));
                }
            }
            None
        } else {
            let now = rokka_store::now_ms();
            match rokka_broker::timer::requested_time(parts[0].2.as_bytes(), now) {
                Ok(at) => at.filter(|due| *due > now),
                Err(k) => {
                    return Err(self.reply(
                        req,
                        rs::MESSAGE_ILLEGAL,
                        Some(format!("timer message property {k} is not a number")),
                    ))
                }
            }
        };
        // Below `cluster.min_insync_replicas`: refused before the append,
        // as Apache's CommitLog (IN_SYNC_REPLICAS_NOT_ENOUGH, answered
        // SYSTEM_ERROR, which clients retry) — stored first and then
        // refused, a client's retry would store the message twice.
        if self.broker.store().too_few_replicas() {
            return Err(self.reply(req, rs::SYSTEM_ERROR, Some("in-sync replicas not enough".into())));
        }
        let appended = match delay {
            // (Half and timer messages take the transaction / timer state's
            // lock, which a check scan or a due delivery may hold for long:
            // waited for off the async workers, as Apache's service threads.)
            _ if prepared => rokka_broker::offload(|| self.broker.append_half(&inputs[0])).map(|r| vec![r]),
            _ if timer.is_some() => {
                rokka_broker::offload(|| self.broker.append_timer(&inputs[0], timer.unwrap_or_default()))
                    .map(|r| vec![r])
            }
            Some(level) => self.broker.append_delayed(&inputs[0], level).map(|r| vec![r]),
            None => self.broker.append_messages(&inputs),
        };
        let results = match appended {
            Ok(r) => r,
            Err(e) => {
                let code = match &e {
                    rokka_broker::BrokerError::Store(
                        rokka_store::StoreError::MessageTooLarge { .. }
                        | rokka_store::StoreError::PropertiesTooLarge(_),
                    )
                    | rokka_broker::BrokerError::TimerTooFar { .. } => rs::MESSAGE_ILLEGAL,
                    // Not the set's master (cluster mode): the client
                    // retries on another broker after a route refresh.
                    rokka_broker::BrokerError::Store(
                        rokka_store::StoreError::NotLeader | rokka_store::StoreError::ShutDown,
                    ) => rs::SERVICE_NOT_AVAILABLE,
                    _ => rs::SYSTEM_ERROR,
                };
                return Err(self.reply(req, code, Some(e.to_string())));
            }
        };
        let bytes: usize = parts.iter().map(|(_, b, p)| b.len() + p.len()).sum();
        self.broker
            .traffic()
            .rocketmq_in
            .record(&topic, results.len() as u64, bytes as u64);
        let end = results.iter().map(|x| x.end_offset).max().unwrap_or(0);
        if req.is_oneway() {
            // No answer goes out: nothing to put in one.
            return Ok((self.reply(req, rs::SUCCESS, None), end));
        }
        let host = self.store_host;
        let ids: Vec<String> = results.iter().map(|r| msgid::message_id(host, r.phys_offset)).collect();
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields.set("msgId", ids.join(","));
        r.ext_fields.set("queueId", queue.to_string());
        r.ext_fields
            .set("queueOffset", results.first().map_or(0, |x| x.queue_offset).to_string());
        if let Some(u) = properties::get(parts[0].2.as_bytes(), properties::UNIQ_KEY) {
            r.ext_fields
                .set("transactionId", String::from_utf8_lossy(u).into_owned());
        }
        r.ext_fields.set("MSG_REGION", "DefaultRegion");
        r.ext_fields.set("TRACE_ON", "true");
        Ok((r, end))
    }

    /// CONSUMER_SEND_MSG_BACK: a message the consumer failed goes to
    /// `%RETRY%<group>` with the delay level its reconsume count selects
    /// (3 + times, or the level the consumer asked for), or to `%DLQ%<group>`
    /// once it was reconsumed `maxReconsumeTimes` (the client's, else the
    /// group's retryMaxTimes, default 16) times or the
    /// consumer asked for a negative level. Both are ordinary topics.
    pub(super) fn send_back(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        use rokka_broker::schedule::{without, DELAY, REAL_QID, REAL_TOPIC};
        let group = req.ext_fields.get("group").unwrap_or_default().to_string();
        let phys = ext_i64(req, "offset", "offset").unwrap_or(-1);
        let delay_level = ext_i64(req, "delayLevel", "delayLevel").unwrap_or(0);
        let config = self.broker.sub_groups().honoured(&group);
        // The client's limit; else the group's retryMaxTimes (Apache's order).
        let max_times =
            ext_i64(req, "maxReconsumeTimes", "maxReconsumeTimes").unwrap_or(i64::from(config.retry_max_times));
        let origin_id = req.ext_fields.get("originMsgId").unwrap_or_default().to_string();
        if group.is_empty() || phys < 0 {
            return self.reply(req, rs::SYSTEM_ERROR, Some("group and offset are required".into()));
        }
        // A group configured with no retry queue: the failed message is
        // not retried, and the send-back succeeds (Apache's answer).
        if config.retry_queue_nums <= 0 {
            return self.reply(req, rs::SUCCESS, None);
        }
        let Some(m) = self
            .broker
            .store()
            .read_at(phys as u64)
            .and_then(|rec| match rokka_store::decode_entry(&rec) {
                Ok(Entry::Message(m)) => Some(m),
                _ => None,
            })
        else {
            // Kafka-produced records share their batch's offset: the client
            // redelivers those itself (RocketMQ's fallback).
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("look message by offset failed, {phys}")),
            );
        };
        // The offset is the client's to name: READ on the topic the record
        // was sent to as well as on the group (else any record could be
        // copied into the caller's own retry topic and read there).
        let read_as = m
            .property("RETRY_TOPIC")
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .unwrap_or_else(|| crate::auth::topic_of_message(&m));
        let need = rokka_broker::acl::rocketmq_topic(&read_as, rokka_broker::acl::Operation::Read);
        if let Some(remark) = crate::auth::check_need(&self.broker, conn, req, need) {
            return self.reply(req, crate::auth::NO_PERMISSION, Some(remark));
        }
        let user = m.user_properties();
        let origin_topic = m
            .property("RETRY_TOPIC")
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .unwrap_or_else(|| m.topic_str().to_string());
        let mut props = without(&user, &[DELAY, REAL_TOPIC, REAL_QID]);
        let mut add = |k: &str, v: &str| {
            props.extend_from_slice(k.as_bytes());
            props.push(properties::NAME_VALUE_SEPARATOR);
            props.extend_from_slice(v.as_bytes());
            props.push(properties::PROPERTY_SEPARATOR);
        };
        if m.property("RETRY_TOPIC").is_none() {
            add("RETRY_TOPIC", &origin_topic);
        }
        if m.property("ORIGIN_MESSAGE_ID").is_none() && !origin_id.is_empty() {
            add("ORIGIN_MESSAGE_ID", &origin_id);
        }
        let times = m.reconsume_times;
        let dlq = i64::from(times) >= max_times || delay_level < 0;
        let topic = if dlq {
            format!("%DLQ%{group}")
        } else {
            format!("%RETRY%{group}")
        };
        if self.broker.topics().get(&topic).is_none_or(|t| t.partitions == 0) {
            // This set's own retry or dead-letter queue (Apache makes them
            // on the broker that took the send-back).
            if let Err(e) = self.broker.ensure_own_topic(&topic, 1) {
                return self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string()));
            }
        }
        let input = MessageInput {
            reconsume_times: times.saturating_add(1),
            ..m.as_input(&topic, 0, &props)
        };
        let res = if dlq {
            metrics::counter!("rokka_rocketmq_dlq_messages_total", "group" => group.clone()).increment(1);
            self.broker.append_messages(std::slice::from_ref(&input)).map(|_| ())
        } else {
            metrics::counter!("rokka_rocketmq_retries_total", "group" => group.clone()).increment(1);
            let level = if delay_level > 0 {
                delay_level as usize
            } else {
                3 + times.max(0) as usize
            };
            self.broker.append_delayed(&input, level).map(|_| ())
        };
        match res {
            Ok(()) => self.reply(req, rs::SUCCESS, None),
            Err(e) => self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string())),
        }
    }
}

/// Splits a SEND_BATCH_MESSAGE body (§4.4) into (flag, body, properties).
pub fn split_batch(body: &[u8]) -> Option<Vec<(i32, Bytes, String)>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let be32 = |b: &[u8], i: usize| b.get(i..i + 4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]]));
    while at < body.len() {
        // A negative TOTALSIZE is refused, not wrapped into a huge length.
        let total = usize::try_from(be32(body, at)?).ok()?;
        let flag = be32(body, at + 12)?;
        let blen = be32(body, at + 16)?;
        if blen < 0 || total < 22 {
            return None;
        }
        let b0 = at + 20;
        let b1 = b0.checked_add(blen as usize)?;
        let msg = Bytes::copy_from_slice(body.get(b0..b1)?);
        let plen = body.get(b1..b1 + 2).map(|x| i16::from_be_bytes([x[0], x[1]]))?;
        if plen < 0 {
            return None;
        }
        let props = body.get(b1 + 2..b1 + 2 + plen as usize)?;
        out.push((flag, msg, String::from_utf8_lossy(props).into_owned()));
        if at.checked_add(total)? > body.len() || total != 22 + blen as usize + plen as usize {
            return None;
        }
        at += total;
    }
    (!out.is_empty()).then_some(out)
}
