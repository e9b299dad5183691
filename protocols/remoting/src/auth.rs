//! RocketMQ requests checked against the broker's one ACL table (the one
//! Kafka's ACL APIs manage): a send is a WRITE on its topic (RocketMQ
//! PUB), a pull a READ on the topic and the consumer group (SUB), offset
//! commits and send-backs a READ on the group, offset and consumer
//! queries a DESCRIBE, and the admin codes what Kafka's admin APIs need
//! (UPDATE_AND_CREATE_TOPIC: CREATE, DELETE_TOPIC_IN_NAMESRV: DELETE on
//! the topic, GET_ALL_TOPIC_CONFIG: DESCRIBE on the cluster). A refusal is
//! answered NO_PERMISSION with a remark naming what was missing, logged
//! once per connection and counted.
//!
//! Authentication is RocketMQ's AccessKey/Signature scheme
//! (AclClientRPCHook): the AccessKey is a user of the one users table, the
//! Signature an HMAC (SHA-1, or SHA-256) under its RocketMQ secret of the
//! request's extFields values in key order (Signature left out) followed by
//! its body. A verified request is `User:<AccessKey>`; one without an
//! AccessKey is the connection's client certificate's principal
//! (`User:<subject DN>`, TLS listeners with a client CA) or else
//! `User:ANONYMOUS`; a wrong or unknown one is refused
//! NO_PERMISSION. Like a RocketMQ broker with `aclEnable = false`, nothing
//! is checked with authorization off.

use std::sync::atomic::{AtomicBool, Ordering};

use rokka_broker::acl::{rocketmq_topic as topic_need, Operation as Op, ResourceType as Rt, ANONYMOUS, CLUSTER_NAME};
use rokka_broker::Broker;
use std::borrow::Cow;

use crate::codes::request as rq;
use crate::command::RemotingCommand;

/// RocketMQ's ResponseCode.NO_PERMISSION.
pub const NO_PERMISSION: i32 = 16;

/// What a request needs: at most two (resource, operation) pairs.
type Needs<'a> = [Option<(Rt, &'a str, Op)>; 2];

fn ext<'a>(cmd: &'a RemotingCommand, long: &str, short: &str) -> &'a str {
    cmd.ext_fields
        .get(long)
        .or_else(|| cmd.ext_fields.get(short))
        .unwrap_or_default()
}

/// The group a request names (`group` in a reset, `consumerGroup` elsewhere).
fn group_field(cmd: &RemotingCommand) -> &str {
    let key = if cmd.code == rq::INVOKE_BROKER_TO_RESET_OFFSET {
        "group"
    } else {
        "consumerGroup"
    };
    cmd.ext_fields.get(key).unwrap_or_default()
}

/// The checks a request of `cmd.code` needs; none for codes that touch no
/// topic or group (heartbeats, route queries) or are cluster-internal.
fn needs(cmd: &RemotingCommand) -> Needs<'_> {
    let f = |k: &str| cmd.ext_fields.get(k).unwrap_or_default();
    match cmd.code {
        rq::SEND_MESSAGE | rq::SEND_MESSAGE_V2 | rq::SEND_BATCH_MESSAGE => {
            [Some(topic_need(ext(cmd, "topic", "b"), Op::Write)), None]
        }
        rq::PULL_MESSAGE | rq::LITE_PULL_MESSAGE => [
            Some(topic_need(f("topic"), Op::Read)),
            Some((Rt::Group, f("consumerGroup"), Op::Read)),
        ],
        // As Kafka's admin offset commit: read on the group and the topic.
        rq::UPDATE_CONSUMER_OFFSET | rq::INVOKE_BROKER_TO_RESET_OFFSET => [
            Some((Rt::Group, group_field(cmd), Op::Read)),
            Some(topic_need(f("topic"), Op::Read)),
        ],
        rq::QUERY_CONSUMER_OFFSET | rq::GET_CONSUME_STATS => [
            Some((Rt::Group, f("consumerGroup"), Op::Describe)),
            (!f("topic").is_empty()).then(|| topic_need(f("topic"), Op::Describe)),
        ],
        rq::GET_CONSUMER_LIST_BY_GROUP => [Some((Rt::Group, f("consumerGroup"), Op::Describe)), None],
        rq::CONSUMER_SEND_MSG_BACK => [Some((Rt::Group, f("group"), Op::Read)), None],
        rq::GET_MAX_OFFSET | rq::GET_MIN_OFFSET | rq::SEARCH_OFFSET_BY_TIMESTAMP | rq::GET_EARLIEST_MSG_STORETIME => {
            [Some(topic_need(f("topic"), Op::Describe)), None]
        }
        rq::QUERY_MESSAGE => [Some(topic_need(f("topic"), Op::Read)), None],
        rq::END_TRANSACTION if !f("topic").is_empty() => [Some(topic_need(f("topic"), Op::Write)), None],
        rq::UPDATE_AND_CREATE_TOPIC => [Some((Rt::Topic, f("topic"), Op::Create)), None],
        rq::DELETE_TOPIC_IN_NAMESRV => [Some((Rt::Topic, f("topic"), Op::Delete)), None],
        rq::GET_ALL_TOPIC_CONFIG | rq::AUTH_GET_USER | rq::AUTH_LIST_USERS => {
            [Some((Rt::Cluster, CLUSTER_NAME, Op::Describe)), None]
        }
        rq::AUTH_CREATE_USER | rq::AUTH_UPDATE_USER | rq::AUTH_DELETE_USER => {
            [Some((Rt::Cluster, CLUSTER_NAME, Op::Alter)), None]
        }
        _ => [None, None],
    }
}

fn allowed(broker: &Broker, principal: &str, host: std::net::IpAddr, need: (Rt, &str, Op)) -> bool {
    broker.acls().allows(principal, host, need)
}

/// Per connection: whether a refusal was logged yet.
#[derive(Debug, Default)]
pub struct Denials {
    logged: AtomicBool,
}

/// The request's principal: `User:<AccessKey>` once its Signature is
/// verified; without an AccessKey, the connection's certificate's
/// (`certified`) or `User:ANONYMOUS`; Err: why it is refused.
fn principal<'a>(
    broker: &Broker,
    certified: Option<&'a str>,
    cmd: &'a RemotingCommand,
) -> Result<Cow<'a, str>, String> {
    let Some(ak) = cmd.ext_fields.get("AccessKey") else {
        return Ok(Cow::Borrowed(certified.unwrap_or(ANONYMOUS)));
    };
    let Some(signature) = cmd.ext_fields.get("Signature") else {
        return Err(format!("AccessKey {ak} without a Signature"));
    };
    match broker
        .users()
        .check_rocketmq_signature(ak, signed_content(cmd), signature)
    {
        Ok(()) => Ok(Cow::Owned(format!("User:{ak}"))),
        Err(why) => Err(format!("authentication of AccessKey {ak} failed: {why}")),
    }
}

/// A request's signed content: its extFields values in key order
/// (Signature left out), then its body.
fn signed_content(cmd: &RemotingCommand) -> impl Iterator<Item = &[u8]> + Clone {
    let mut fields: Vec<&(String, String)> = cmd.ext_fields.0.iter().filter(|(k, _)| k != "Signature").collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    fields
        .into_iter()
        .map(|(_, v)| v.as_bytes())
        .chain(std::iter::once(cmd.body.as_ref()))
}

/// Signs a call to another set's master as the cluster's own
/// (rokka_broker::internal); unsigned outside cluster mode.
pub fn sign_as_cluster(broker: &Broker, cmd: &mut RemotingCommand) {
    let Some(secret) = broker.cluster_secret() else {
        return;
    };
    let node = broker.cluster_view().map_or(0, |v| v.self_id);
    cmd.ext_fields.set(
        "AccessKey",
        format!("{}node-{node}", rokka_broker::internal::ACCESS_KEY_PREFIX),
    );
    let signature = secret.sign(signed_content(cmd));
    cmd.ext_fields.set("Signature", signature);
}

/// `None`: the request may be served; `Some(remark)`: answer
/// NO_PERMISSION with it.
pub fn check(broker: &Broker, conn: &crate::server::Conn, cmd: &RemotingCommand) -> Option<String> {
    if !broker.acls().enabled() {
        return None;
    }
    let (peer, denials) = (conn.peer, &*conn.denials);
    let refused = |remark: String, resource: &'static str| {
        metrics::counter!("rokka_authorization_denied_total", "protocol" => "rocketmq", "resource" => resource)
            .increment(1);
        if !denials.logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(%peer, code = cmd.code, remark, "RocketMQ request denied (further denials on this connection are only counted)");
        }
        Some(remark)
    };
    // The cluster's own calls between sets: served as the coordinator
    // that makes them already authorized its client, whatever the ACLs say
    // of the connection (checked before the hold-off, which a client
    // failing signatures from a node's address must not bring upon it).
    if let Some(ak) = cmd.ext_fields.get("AccessKey") {
        if ak.starts_with(rokka_broker::internal::ACCESS_KEY_PREFIX) {
            let signed = match (broker.cluster_secret(), cmd.ext_fields.get("Signature")) {
                (Some(secret), Some(sig)) => secret.verify(signed_content(cmd), sig),
                _ => false,
            };
            if signed {
                return None;
            }
            metrics::counter!("rokka_rocketmq_authentications_failed_total", "reason" => "cluster_signature")
                .increment(1);
            return refused(
                format!("AccessKey {ak} is the cluster's own, and the request is not signed by this cluster"),
                "credentials",
            );
        }
    }
    // Every signed request is verified, whatever it asks.
    if cmd.ext_fields.get("AccessKey").is_some() && conn.auth_failures.blocked(peer.ip()) {
        metrics::counter!("rokka_rocketmq_authentications_failed_total", "reason" => "held_off").increment(1);
        return refused(
            format!(
                "too many failed authentications from {}: signed requests are refused for a while",
                peer.ip()
            ),
            "credentials",
        );
    }
    let who = match principal(broker, conn.certificate_principal.as_deref(), cmd) {
        Ok(p) => p,
        Err(remark) => {
            metrics::counter!("rokka_rocketmq_authentications_failed_total", "reason" => "signature").increment(1);
            conn.auth_failures.failed(peer.ip());
            return refused(remark, "credentials");
        }
    };
    for need in needs(cmd).into_iter().flatten() {
        if !allowed(broker, &who, peer.ip(), need) {
            let (rt, name, op) = need;
            let what = match (rt, op) {
                (Rt::Topic, Op::Write) => " (PUB)",
                (Rt::Topic, Op::Read) | (Rt::Group, Op::Read) => " (SUB)",
                _ => "",
            };
            return refused(
                format!("no permission: {who} may not {op:?} {} {name}{what}", rt.label()),
                rt.label(),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(code: i32, fields: &[(&str, &str)]) -> RemotingCommand {
        let mut c = RemotingCommand::request(code, 1);
        for (k, v) in fields {
            c.ext_fields.set(k, *v);
        }
        c
    }

    #[test]
    fn requests_map_to_kafka_operations() {
        let send = cmd(rq::SEND_MESSAGE_V2, &[("b", "orders")]);
        assert_eq!(needs(&send), [Some((Rt::Topic, "orders", Op::Write)), None]);
        let pull = cmd(rq::PULL_MESSAGE, &[("topic", "%RETRY%g1"), ("consumerGroup", "g1")]);
        assert_eq!(
            needs(&pull),
            [Some((Rt::Group, "g1", Op::Read)), Some((Rt::Group, "g1", Op::Read))]
        );
        let create = cmd(rq::UPDATE_AND_CREATE_TOPIC, &[("topic", "t")]);
        assert_eq!(needs(&create), [Some((Rt::Topic, "t", Op::Create)), None]);
        assert_eq!(needs(&cmd(rq::HEART_BEAT, &[])), [None, None]);
    }
}
