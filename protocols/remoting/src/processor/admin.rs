//! Topic administration and message queries by key and id.

use super::*;

impl RocketMq {
    pub(super) fn create_topic(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let n = ext_i64(req, "writeQueueNums", "writeQueueNums")
            .or_else(|| ext_i64(req, "readQueueNums", "readQueueNums"))
            .unwrap_or(8)
            .max(1) as u32;
        match self.broker.create_topic(topic, n) {
            Ok(_) => self.reply(req, rs::SUCCESS, None),
            Err(rokka_broker::BrokerError::TopicExists(_)) => {
                // Several broker sets: the count is the topic's (every
                // set's queues), as Kafka's partition count is.
                let current = self.broker.topics().get(topic).map_or(n, |t| t.kafka_partitions());
                if n > current {
                    if let Err(e) = self.broker.add_partitions(topic, n) {
                        return self.reply(req, 29, Some(e.to_string()));
                    }
                }
                self.reply(req, rs::SUCCESS, None)
            }
            Err(e) => self.reply(req, 29, Some(e.to_string())),
        }
    }

    /// QUERY_MESSAGE: messages of `topic` by key (a KEYS token, or the
    /// client's unique id), stored within [beginTimestamp, endTimestamp],
    /// from the IndexFile; QUERY_NOT_FOUND when none.
    pub(super) fn query_message(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let key = req.ext_fields.get("key").unwrap_or_default();
        let max = ext_i64(req, "maxNum", "maxNum").unwrap_or(32).clamp(1, 64) as usize;
        let begin = ext_i64(req, "beginTimestamp", "beginTimestamp").unwrap_or(0);
        let end = ext_i64(req, "endTimestamp", "endTimestamp").unwrap_or(i64::MAX);
        let unique = ext_bool(req, "_UNIQUE_KEY_QUERY", "_UNIQUE_KEY_QUERY");
        let found = self
            .broker
            .store()
            .query_by_key(topic, key, if unique { 1 } else { max }, begin, end);
        metrics::counter!("rokka_rocketmq_queries_total", "kind" => if unique { "unique_key" } else { "key" })
            .increment(1);
        if found.is_empty() {
            return self.reply(
                req,
                rs::QUERY_NOT_FOUND,
                Some(format!(
                    "can not find message, maybe time range not correct: {topic} {key}"
                )),
            );
        }
        let mut body = BytesMut::new();
        for rec in &found {
            body.put_slice(rec);
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields
            .set("indexLastUpdateTimestamp", rokka_store::now_ms().to_string());
        r.ext_fields.set("indexLastUpdatePhyoffset", "0");
        r.body = body.freeze();
        r
    }

    /// VIEW_MESSAGE_BY_ID: the stored message at a CommitLog offset (the
    /// offset part of a message id); a Kafka batch answers with its first
    /// record, converted.
    pub(super) fn view_message(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let phys = ext_i64(req, "offset", "offset").unwrap_or(-1);
        metrics::counter!("rokka_rocketmq_queries_total", "kind" => "id").increment(1);
        let rec = (phys >= 0).then(|| self.broker.store().read_at(phys as u64)).flatten();
        let entry = rec.as_ref().map(rokka_store::decode_entry);
        // Any offset may be asked for: READ on the record's topic, whose
        // ACLs would otherwise be read around.
        if let Some(Ok(e)) = &entry {
            let topic = crate::auth::topic_of_record(e);
            let need = rokka_broker::acl::rocketmq_topic(&topic, rokka_broker::acl::Operation::Read);
            if let Some(remark) = crate::auth::check_need(&self.broker, conn, req, need) {
                return self.reply(req, crate::auth::NO_PERMISSION, Some(remark));
            }
        }
        let body = match entry {
            Some(Ok(Entry::Message(_))) => rec.unwrap_or_default(),
            Some(Ok(Entry::KafkaBatch(b))) => {
                let mut out = BytesMut::new();
                match rokka_broker::convert::kafka_batch_to_rocketmq(
                    &b,
                    b.queue_offset,
                    None,
                    self.store_host,
                    self.broker.config().max_batch_decompressed_bytes as usize,
                    &mut out,
                ) {
                    Ok(_) if !out.is_empty() => {
                        let first = (u32::from_be_bytes([out[0], out[1], out[2], out[3]]) as usize).min(out.len());
                        out.freeze().slice(..first)
                    }
                    _ => Bytes::new(),
                }
            }
            _ => Bytes::new(),
        };
        if body.is_empty() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("can not find message by the offset, {phys}")),
            );
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = body;
        r
    }

    pub(super) fn all_topic_config(&self, req: &RemotingCommand) -> RemotingCommand {
        let mut table = serde_json::Map::new();
        for (name, t) in self.broker.topics().all() {
            table.insert(
                name.clone(),
                json!({"topicName": name, "readQueueNums": t.partitions, "writeQueueNums": t.partitions,
                       "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": false, "attributes": {}}),
            );
        }
        self.json_body(
            req,
            json!({"topicConfigTable": table, "dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": 0}}),
        )
    }
}
