//! Transactions: END_TRANSACTION and the broker's checks of half messages.

use super::*;

impl RocketMq {
    /// The answer to a transaction participant's request.
    pub(super) fn txn_reply(
        &self,
        req: &RemotingCommand,
        r: Result<(), crate::remote_txns::Refused>,
    ) -> RemotingCommand {
        match r {
            Ok(()) => self.reply(req, rs::SUCCESS, None),
            Err(why) => {
                let mut resp = self.reply(req, why.code, Some(why.remark));
                if let Some(c) = why.kafka {
                    resp.ext_fields.set(crate::remote_txns::EXT_KAFKA_ERROR, c.to_string());
                }
                resp
            }
        }
    }

    /// END_TRANSACTION (usually oneway): 8 commits, 12 rolls back, 0 (unknown)
    /// leaves the half message for a later check.
    pub(super) fn end_transaction(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let group = req.ext_fields.get("producerGroup").unwrap_or_default();
        let half_offset = ext_i64(req, "tranStateTableOffset", "tranStateTableOffset").unwrap_or(-1);
        let half_phys = ext_i64(req, "commitLogOffset", "commitLogOffset").unwrap_or(-1);
        let kind = ext_i64(req, "commitOrRollback", "commitOrRollback").unwrap_or(0);
        let commit = match kind {
            8 => true,
            12 => false,
            _ => return self.reply(req, rs::SUCCESS, None),
        };
        if half_offset < 0 || half_phys < 0 {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some("tranStateTableOffset and commitLogOffset are required".into()),
            );
        }
        // WRITE on the topic the half message is bound for (what ending it
        // writes to), whatever topic the request names.
        if let Some(real) = self.broker.half_message_topic(half_phys as u64) {
            let need = rokka_broker::acl::rocketmq_topic(&real, rokka_broker::acl::Operation::Write);
            if let Some(remark) = crate::auth::check_need(&self.broker, conn, req, need) {
                return self.reply(req, crate::auth::NO_PERMISSION, Some(remark));
            }
        }
        match self
            .broker
            .end_transaction(group, half_offset as u64, half_phys as u64, commit)
        {
            Ok(_) => self.reply(req, rs::SUCCESS, None),
            Err(e) => {
                // (Any client may send these, oneway too: counted, logged
                // at most once a minute.)
                metrics::counter!("rokka_rocketmq_end_transaction_refused_total").increment(1);
                static LOG: rokka_broker::limits::LogEvery = rokka_broker::limits::LogEvery::new(60_000);
                if LOG.ready() {
                    tracing::warn!(group, half_offset, error = %e, "END_TRANSACTION refused");
                }
                self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string()))
            }
        }
    }
}

/// Transaction checks to remoting producers: CHECK_TRANSACTION_STATE to a
/// live producer of the half message's group — with authorization on, one
/// signed as a principal allowed to write the message's topic (a check
/// carries the whole half message: a client naming the group in its
/// heartbeat, which needs no permission, would read uncommitted messages
/// and could answer them). Candidates are tried in turn from a rotating
/// start (Apache's ProducerManager.getAvailableChannel): a producer whose
/// connection takes nothing does not hold every check of its group.
impl rokka_broker::transaction::TxnCheckSink for RocketMq {
    fn check(&self, d: &rokka_broker::transaction::DueCheck) -> bool {
        let write = (
            rokka_broker::acl::ResourceType::Topic,
            d.real_topic.as_str(),
            rokka_broker::acl::Operation::Write,
        );
        let conns: Vec<Conn> = {
            let c = self.clients();
            c.clients
                .values()
                .filter(|cl| {
                    cl.producer_groups.contains(&d.producer_group)
                        && !cl.conn.is_closed()
                        && crate::auth::may(&self.broker, cl.principal.as_deref(), cl.conn.peer.ip(), write)
                })
                .map(|cl| cl.conn.clone())
                .collect()
        };
        if conns.is_empty() {
            return false;
        }
        let start = self.check_turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % conns.len();
        conns[start..]
            .iter()
            .chain(&conns[..start])
            .any(|conn| self.send_check(conn, d))
    }
}

impl RocketMq {
    fn send_check(&self, conn: &Conn, d: &rokka_broker::transaction::DueCheck) -> bool {
        let mut n = RemotingCommand::request(rq::CHECK_TRANSACTION_STATE, conn.next_opaque());
        n.flag = FLAG_ONEWAY;
        n.version = self.config.server_version;
        n.ext_fields.set("topic", d.real_topic.as_str());
        n.ext_fields.set("tranStateTableOffset", d.half_offset.to_string());
        n.ext_fields.set("commitLogOffset", d.half_phys.to_string());
        n.ext_fields.set("msgId", d.transaction_id.as_str());
        n.ext_fields.set("transactionId", d.transaction_id.as_str());
        n.ext_fields
            .set("offsetMsgId", msgid::message_id(self.store_host, d.half_phys));
        n.ext_fields.set("bname", self.config.broker_name.as_str());
        n.body = d.record.clone();
        conn.send(n)
    }
}
