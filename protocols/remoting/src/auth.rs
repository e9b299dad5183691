//! RocketMQ requests checked against the broker's one ACL table (the one
//! Kafka's ACL APIs manage): a send is a WRITE on its topic (RocketMQ
//! PUB), a pull a READ on the topic and the consumer group (SUB), offset
//! commits and send-backs a READ on the group, offset and consumer
//! queries a DESCRIBE, and the admin codes what Kafka's admin APIs need
//! (UPDATE_AND_CREATE_TOPIC: CREATE, DELETE_TOPIC_IN_NAMESRV: DELETE on
//! the topic, GET_ALL_TOPIC_CONFIG: DESCRIBE on the cluster, a name server's
//! REGISTER_BROKER and UNREGISTER_BROKER: CLUSTER_ACTION on the cluster). A refusal is
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
pub const NO_PERMISSION: i32 = crate::codes::response::NO_PERMISSION;

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
        rq::SEND_MESSAGE
        | rq::SEND_MESSAGE_V2
        | rq::SEND_BATCH_MESSAGE
        | rq::SEND_REPLY_MESSAGE
        | rq::SEND_REPLY_MESSAGE_V2 => [Some(topic_need(ext(cmd, "topic", "b"), Op::Write)), None],
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
        // Leaving a group is a member's act (Apache 5: SUB on the group);
        // a heartbeat's groups and topics are checked where its body is read.
        rq::UNREGISTER_CLIENT if !f("consumerGroup").is_empty() => {
            [Some((Rt::Group, f("consumerGroup"), Op::Read)), None]
        }
        rq::CONSUMER_SEND_MSG_BACK => [Some((Rt::Group, f("group"), Op::Read)), None],
        rq::GET_MAX_OFFSET | rq::GET_MIN_OFFSET | rq::SEARCH_OFFSET_BY_TIMESTAMP | rq::GET_EARLIEST_MSG_STORETIME => {
            [Some(topic_need(f("topic"), Op::Describe)), None]
        }
        rq::QUERY_MESSAGE => [Some(topic_need(f("topic"), Op::Read)), None],
        rq::END_TRANSACTION if !f("topic").is_empty() => [Some(topic_need(f("topic"), Op::Write)), None],
        rq::UPDATE_AND_CREATE_TOPIC => [Some((Rt::Topic, f("topic"), Op::Create)), None],
        rq::DELETE_TOPIC_IN_NAMESRV | rq::DELETE_TOPIC_IN_BROKER => [Some((Rt::Topic, f("topic"), Op::Delete)), None],
        rq::DELETE_SUBSCRIPTIONGROUP => [Some((Rt::Group, f("groupName"), Op::Delete)), None],
        rq::GET_TOPIC_CONFIG | rq::GET_TOPIC_STATS_INFO | rq::QUERY_TOPIC_CONSUME_BY_WHO => {
            [Some((Rt::Topic, f("topic"), Op::Describe)), None]
        }
        rq::GET_CONSUMER_CONNECTION_LIST => [Some((Rt::Group, f("consumerGroup"), Op::Describe)), None],
        rq::GET_SUBSCRIPTIONGROUP_CONFIG | rq::QUERY_TOPICS_BY_CONSUMER => {
            [Some((Rt::Group, f("group"), Op::Describe)), None]
        }
        rq::QUERY_SUBSCRIPTION_BY_CONSUMER => [
            Some((Rt::Group, f("group"), Op::Describe)),
            Some(topic_need(f("topic"), Op::Describe)),
        ],
        rq::GET_PRODUCER_CONNECTION_LIST
        | rq::GET_BROKER_RUNTIME_INFO
        | rq::GET_BROKER_CONFIG
        | rq::GET_KV_CONFIG
        | rq::GET_KVLIST_BY_NAMESPACE => [Some((Rt::Cluster, CLUSTER_NAME, Op::Describe)), None],
        rq::PUT_KV_CONFIG | rq::DELETE_KV_CONFIG | rq::WIPE_WRITE_PERM_OF_BROKER | rq::ADD_WRITE_PERM_OF_BROKER => {
            [Some((Rt::Cluster, CLUSTER_NAME, Op::Alter)), None]
        }
        // A broker's registration puts its address in every route of the
        // topics it names: what a Kafka broker's own calls to the
        // controller need.
        rq::REGISTER_BROKER | rq::UNREGISTER_BROKER => [Some((Rt::Cluster, CLUSTER_NAME, Op::ClusterAction)), None],
        // (The group is named in the body: an admin's call on the cluster.)
        rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP | rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST => {
            [Some((Rt::Cluster, CLUSTER_NAME, Op::Alter)), None]
        }
        rq::GET_ALL_TOPIC_CONFIG | rq::GET_ALL_SUBSCRIPTIONGROUP_CONFIG | rq::AUTH_GET_USER | rq::AUTH_LIST_USERS => {
            [Some((Rt::Cluster, CLUSTER_NAME, Op::Describe)), None]
        }
        rq::AUTH_CREATE_USER | rq::AUTH_UPDATE_USER | rq::AUTH_DELETE_USER => {
            [Some((Rt::Cluster, CLUSTER_NAME, Op::Alter)), None]
        }
        _ => [None, None],
    }
}

/// Deleting a group whose subscription-group config is kept also takes
/// away that config, which only ALTER on the cluster sets (an application
/// allowed to delete its own group must not lift an operator's
/// `consumeEnable=false` that way).
fn config_need<'a>(broker: &Broker, cmd: &'a RemotingCommand) -> Option<(Rt, &'a str, Op)> {
    (cmd.code == rq::DELETE_SUBSCRIPTIONGROUP
        && broker
            .sub_groups()
            .contains(cmd.ext_fields.get("groupName").unwrap_or_default()))
    .then_some((Rt::Cluster, CLUSTER_NAME, Op::Alter))
}

/// Whether `cmd`'s caller may take a subscription-group config away (ALTER
/// on the cluster, what setting one takes): always with authorization off.
/// DELETE_SUBSCRIPTIONGROUP of a group without a config here queues the
/// deletion for the cluster only then — in cluster mode another node may
/// have set one this node has not seen yet.
pub fn may_drop_config(broker: &Broker, conn: &crate::server::Conn, cmd: &RemotingCommand) -> bool {
    if !broker.acls().enabled() {
        return true;
    }
    principal_of(broker, conn, cmd)
        .is_some_and(|who| allowed(broker, &who, conn.peer.ip(), (Rt::Cluster, CLUSTER_NAME, Op::Alter)))
}

fn allowed(broker: &Broker, principal: &str, host: std::net::IpAddr, need: (Rt, &str, Op)) -> bool {
    broker.acls().allows(principal, host, need)
}

/// Per connection: whether a refusal was logged yet.
#[derive(Debug, Default)]
pub struct Denials {
    logged: AtomicBool,
}

/// Why a signed request was not authenticated, and whether it was a wrong
/// signature for a secret the user has — a guess, which counts toward the
/// address's hold-off. A user without a RocketMQ secret (made through
/// Kafka's SCRAM API: the web console signs as its logged-in user), an
/// unknown AccessKey or a missing signature guesses nothing: counted, such
/// refusals held off every signed client of the address (the console's
/// own, 127.0.0.1).
struct NotAuthenticated {
    remark: String,
    guessed: bool,
}

/// The request's principal: `User:<AccessKey>` once its Signature is
/// verified; without an AccessKey, the connection's certificate's
/// (`certified`) or `User:ANONYMOUS`; Err: why it is refused.
fn principal<'a>(
    broker: &Broker,
    certified: Option<&'a str>,
    cmd: &'a RemotingCommand,
) -> Result<Cow<'a, str>, NotAuthenticated> {
    let Some(ak) = cmd.ext_fields.get("AccessKey") else {
        return Ok(Cow::Borrowed(certified.unwrap_or(ANONYMOUS)));
    };
    let Some(signature) = cmd.ext_fields.get("Signature") else {
        return Err(NotAuthenticated {
            remark: format!("AccessKey {ak} without a Signature"),
            guessed: false,
        });
    };
    match broker
        .users()
        .check_rocketmq_signature(ak, signed_content(cmd), signature)
    {
        Ok(()) => Ok(Cow::Owned(format!("User:{ak}"))),
        Err(why) => Err(NotAuthenticated {
            remark: format!("authentication of AccessKey {ak} failed: {why}"),
            guessed: why == rokka_broker::users::WRONG_SIGNATURE,
        }),
    }
}

/// A request's signed content: its extFields values in key order
/// (Signature left out), then its body. Clients up to V4_9_3 (version 399)
/// left `_UNIQUE_KEY_QUERY` out of what they signed, and Apache's ACL
/// leaves it out for them (PlainAccessResource, ISSUE #1409).
fn signed_content(cmd: &RemotingCommand) -> impl Iterator<Item = &[u8]> + Clone {
    let old_client = cmd.version <= 399;
    let mut fields: Vec<&(crate::command::FieldName, String)> = cmd
        .ext_fields
        .0
        .iter()
        .filter(|(k, _)| k != "Signature" && !(old_client && k == "_UNIQUE_KEY_QUERY"))
        .collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    fields
        .into_iter()
        .map(|(_, v)| v.as_bytes())
        .chain(std::iter::once(cmd.body.as_ref()))
}

/// The request codes the cluster's own calls use (a Kafka coordinator's
/// offset commits and reads on another set's master, transaction joins and
/// ends): a request signed as the cluster may be one of these only.
const CLUSTER_CALLS: [i32; 8] = [
    // Each node registers with every node's name server.
    rq::REGISTER_BROKER,
    rq::UNREGISTER_BROKER,
    rq::UPDATE_CONSUMER_OFFSET,
    rq::QUERY_CONSUMER_OFFSET,
    rq::GET_CONSUME_STATS,
    rq::DELETE_SUBSCRIPTIONGROUP,
    rq::ROKKA_TXN_JOIN,
    rq::ROKKA_TXN_END,
];

/// The extField carrying when a cluster call was signed (ms since the epoch).
const CLUSTER_TIME: &str = "rokkaTime";

/// How far a cluster call's signing time may be from the master's clock.
const CLUSTER_MAX_SKEW_MS: u64 = 60_000;

/// What a cluster call's signature covers: a version tag, the request
/// code, every extFields key and value (Signature left out) in key order,
/// and the body, each length-prefixed, so no part can be moved into
/// another.
fn cluster_content(cmd: &RemotingCommand) -> Vec<u8> {
    let mut fields: Vec<&(crate::command::FieldName, String)> =
        cmd.ext_fields.0.iter().filter(|(k, _)| k != "Signature").collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut out =
        Vec::with_capacity(64 + cmd.body.len() + fields.iter().map(|(k, v)| 8 + k.len() + v.len()).sum::<usize>());
    out.extend_from_slice(b"rokka-cluster-call-v1");
    out.extend_from_slice(&cmd.code.to_be_bytes());
    for part in fields
        .iter()
        .flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()])
        .chain(std::iter::once(cmd.body.as_ref()))
    {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Signs a call to another set's master as the cluster's own
/// (rokka_broker::internal): its code, fields, body and the time;
/// unsigned outside cluster mode.
pub fn sign_as_cluster(broker: &Broker, cmd: &mut RemotingCommand) {
    let Some(secret) = broker.cluster_secret() else {
        return;
    };
    let node = broker.cluster_view().map_or(0, |v| v.self_id);
    cmd.ext_fields.set(
        "AccessKey",
        format!("{}node-{node}", rokka_broker::internal::ACCESS_KEY_PREFIX),
    );
    cmd.ext_fields.set(CLUSTER_TIME, now_ms().to_string());
    let signature = secret.sign(&cluster_content(cmd));
    cmd.ext_fields.set("Signature", signature);
}

/// Whether `cmd`, whose AccessKey is the cluster's, is one of its calls,
/// signed with this cluster's secret within the allowed clock skew; Err:
/// why not.
pub(crate) fn verify_cluster_call(broker: &Broker, cmd: &RemotingCommand) -> Result<(), &'static str> {
    if !CLUSTER_CALLS.contains(&cmd.code) {
        return Err("not a call the cluster makes between its sets");
    }
    let (Some(secret), Some(sig)) = (broker.cluster_secret(), cmd.ext_fields.get("Signature")) else {
        return Err("not signed by this cluster");
    };
    if !secret.verify(&cluster_content(cmd), sig) {
        return Err("not signed by this cluster");
    }
    let signed_at = cmd.ext_fields.get(CLUSTER_TIME).and_then(|t| t.parse::<u64>().ok());
    match signed_at {
        Some(t) if now_ms().abs_diff(t) <= CLUSTER_MAX_SKEW_MS => Ok(()),
        _ => Err("signed too long ago (or the nodes' clocks are more than a minute apart)"),
    }
}

/// `None`: the request may be served; `Some(remark)`: answer
/// NO_PERMISSION with it.
pub fn check(broker: &Broker, conn: &crate::server::Conn, cmd: &RemotingCommand) -> Option<String> {
    if !broker.acls().enabled() {
        return None;
    }
    let peer = conn.peer;
    let refused = |remark: String, resource: &'static str| refuse(conn, cmd, remark, resource);
    // The cluster's own calls between sets: served as the coordinator
    // that makes them already authorized its client, whatever the ACLs say
    // of the connection (checked before the hold-off, which a client
    // failing signatures from a node's address must not bring upon it).
    if let Some(ak) = cmd.ext_fields.get("AccessKey") {
        if ak.starts_with(rokka_broker::internal::ACCESS_KEY_PREFIX) {
            return match verify_cluster_call(broker, cmd) {
                Ok(()) => None,
                Err(why) => {
                    metrics::counter!("rokka_rocketmq_authentications_failed_total", "reason" => "cluster_signature")
                        .increment(1);
                    refused(
                        format!("AccessKey {ak} is the cluster's own, and the request is {why}"),
                        "credentials",
                    )
                }
            };
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
        Err(NotAuthenticated { remark, guessed }) => {
            metrics::counter!("rokka_rocketmq_authentications_failed_total", "reason" => "signature").increment(1);
            if guessed {
                conn.auth_failures.failed(peer.ip());
            }
            return refused(remark, "credentials");
        }
    };
    for need in needs(cmd).into_iter().chain([config_need(broker, cmd)]).flatten() {
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

/// A refusal: counted, logged once per connection, its remark returned.
fn refuse(conn: &crate::server::Conn, cmd: &RemotingCommand, remark: String, resource: &'static str) -> Option<String> {
    metrics::counter!("rokka_authorization_denied_total", "protocol" => "rocketmq", "resource" => resource)
        .increment(1);
    if !conn.denials.logged.swap(true, Ordering::Relaxed) {
        tracing::warn!(peer = %conn.peer, code = cmd.code, remark, "RocketMQ request denied (further denials on this connection are only counted)");
    }
    Some(remark)
}

/// A further check once a handler knows what a request touches (the topic
/// of the record a CommitLog offset names: VIEW_MESSAGE_BY_ID and
/// CONSUMER_SEND_MSG_BACK carry only the offset). `check` has already
/// verified the request's credentials; the cluster's own calls pass.
/// [`check_need`] for several needs of one request (a heartbeat's groups
/// and topics): the request is authenticated once — its signature covers
/// the whole body, so verifying it per need cost the body's hash per
/// subscription — and each distinct need checked.
pub fn check_needs<'a>(
    broker: &Broker,
    conn: &crate::server::Conn,
    cmd: &RemotingCommand,
    needs: impl IntoIterator<Item = (Rt, &'a str, Op)>,
) -> Option<String> {
    if !broker.acls().enabled() {
        return None;
    }
    let mut needs: Vec<(Rt, &str, Op)> = needs.into_iter().collect();
    needs.sort_unstable_by(|a, b| (a.0 as u8, a.1, a.2 as u8).cmp(&(b.0 as u8, b.1, b.2 as u8)));
    needs.dedup();
    let first = needs.first().copied()?;
    // The first need authenticates (and answers for an internal call);
    // the rest are plain ACL look-ups for the principal it found.
    if let Some(refusal) = check_need(broker, conn, cmd, first) {
        return Some(refusal);
    }
    if cmd
        .ext_fields
        .get("AccessKey")
        .is_some_and(|ak| ak.starts_with(rokka_broker::internal::ACCESS_KEY_PREFIX))
    {
        return None;
    }
    let who = principal(broker, conn.certificate_principal.as_deref(), cmd).ok()?;
    for need in needs.into_iter().skip(1) {
        if !allowed(broker, &who, conn.peer.ip(), need) {
            let (rt, name, op) = need;
            return refuse(
                conn,
                cmd,
                format!("no permission: {who} may not {op:?} {} {name}", rt.label()),
                rt.label(),
            );
        }
    }
    None
}

/// With authorization on, who `cmd` is signed as (`None` with it off, or
/// when the signature does not hold: such a request was refused already
/// wherever it needed anything).
pub fn principal_of(broker: &Broker, conn: &crate::server::Conn, cmd: &RemotingCommand) -> Option<String> {
    if !broker.acls().enabled() {
        return None;
    }
    principal(broker, conn.certificate_principal.as_deref(), cmd)
        .ok()
        .map(Cow::into_owned)
}

/// Whether `cmd` is the cluster's own call, verified (its AccessKey the
/// cluster's, signed with the cluster's secret).
pub(crate) fn is_cluster_call(broker: &Broker, cmd: &RemotingCommand) -> bool {
    cmd.ext_fields
        .get("AccessKey")
        .is_some_and(|ak| ak.starts_with(rokka_broker::internal::ACCESS_KEY_PREFIX))
        && verify_cluster_call(broker, cmd).is_ok()
}

/// Who a listing (groups of a topic, a group's topics) is filtered for:
/// `None` sees everything — authorization off, or the cluster's own call
/// (a coordinator listing a group's offsets on another set).
pub fn lister(broker: &Broker, conn: &crate::server::Conn, cmd: &RemotingCommand) -> Option<String> {
    if !broker.acls().enabled() {
        return None;
    }
    if is_cluster_call(broker, cmd) {
        return None;
    }
    Some(
        principal(broker, conn.certificate_principal.as_deref(), cmd)
            .map_or_else(|_| ANONYMOUS.to_string(), Cow::into_owned),
    )
}

/// Whether a [`lister`] sees `need` (Kafka filters a listing by DESCRIBE).
pub fn lists(broker: &Broker, lister: Option<&str>, peer: std::net::IpAddr, need: (Rt, &str, Op)) -> bool {
    lister.is_none_or(|who| allowed(broker, who, peer, need))
}

/// Whether `principal` (as [`principal_of`] gave it; `None`: authorization
/// off) may do `need` from `peer`.
pub fn may(broker: &Broker, principal: Option<&str>, peer: std::net::IpAddr, need: (Rt, &str, Op)) -> bool {
    match principal {
        None => !broker.acls().enabled(),
        Some(who) => allowed(broker, who, peer, need),
    }
}

pub fn check_need(
    broker: &Broker,
    conn: &crate::server::Conn,
    cmd: &RemotingCommand,
    need: (Rt, &str, Op),
) -> Option<String> {
    if !broker.acls().enabled() {
        return None;
    }
    if is_cluster_call(broker, cmd) {
        return None;
    }
    let refused = |remark: String| refuse(conn, cmd, remark, need.0.label());
    match principal(broker, conn.certificate_principal.as_deref(), cmd) {
        Ok(who) if allowed(broker, &who, conn.peer.ip(), need) => None,
        Ok(who) => {
            let (rt, name, op) = need;
            refused(format!("no permission: {who} may not {op:?} {} {name}", rt.label()))
        }
        Err(NotAuthenticated { remark, .. }) => refused(remark),
    }
}

/// The topic a stored record is read as: its real topic when it waits in
/// one of the broker's own (a delayed or half message), else its own.
pub fn topic_of_record(e: &rokka_store::Entry) -> String {
    match e {
        rokka_store::Entry::Message(m) => topic_of_message(m),
        other => other.topic_str().to_string(),
    }
}

/// [`topic_of_record`] of a stored message.
pub fn topic_of_message(m: &rokka_store::record::message::MessageView) -> String {
    m.property(rokka_broker::schedule::REAL_TOPIC)
        .filter(|_| rokka_broker::is_send_forbidden_topic(m.topic_str()))
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .unwrap_or_else(|| m.topic_str().to_string())
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
    fn a_cluster_call_is_signed_whole_and_for_its_code_and_time_only() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = std::sync::Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path().join("data"),
        ))?);
        let broker = Broker::new(store, rokka_broker::BrokerConfig::default())?;
        let secret = rokka_broker::internal::ClusterSecret::generate()?;
        let secret = rokka_broker::internal::ClusterSecret::from_stored(&secret).ok_or("secret")?;
        broker.set_cluster_secret(secret);
        let mut stats = cmd(rq::GET_CONSUME_STATS, &[("consumerGroup", "payments")]);
        sign_as_cluster(&broker, &mut stats);
        assert_eq!(verify_cluster_call(&broker, &stats), Ok(()));
        // The same fields under another code: refused.
        let mut other = stats.clone();
        other.code = rq::UPDATE_AND_CREATE_TOPIC;
        assert!(verify_cluster_call(&broker, &other).is_err());
        // Bytes moved from one field into another (same concatenation).
        let mut moved = stats.clone();
        moved.code = rq::QUERY_CONSUMER_OFFSET;
        let ak = stats.ext_fields.get("AccessKey").unwrap_or_default().to_string();
        moved.ext_fields = crate::command::ExtFields::default();
        for (k, v) in &stats.ext_fields.0 {
            match k.as_ref() {
                "AccessKey" => moved.ext_fields.set("AccessKey", format!("{ak}pay")),
                "consumerGroup" => moved.ext_fields.set("topic", "ments"),
                _ => moved.ext_fields.set(k, v.clone()),
            }
        }
        assert!(verify_cluster_call(&broker, &moved).is_err());
        // A changed body, a signing time out of the window: refused.
        let mut body = stats.clone();
        body.body = bytes::Bytes::from_static(b"x");
        assert!(verify_cluster_call(&broker, &body).is_err());
        let mut stale = cmd(rq::GET_CONSUME_STATS, &[("consumerGroup", "payments")]);
        sign_as_cluster(&broker, &mut stale);
        let old = (now_ms() - 2 * CLUSTER_MAX_SKEW_MS).to_string();
        stale.ext_fields.set(CLUSTER_TIME, old);
        let resigned = broker
            .cluster_secret()
            .map(|s| s.sign(&cluster_content(&stale)))
            .unwrap_or_default();
        stale.ext_fields.set("Signature", resigned);
        assert!(verify_cluster_call(&broker, &stale).is_err(), "signed two minutes ago");
        // A code the cluster never sends, even signed with its secret.
        let mut delete = cmd(rq::UPDATE_AND_CREATE_TOPIC, &[("topic", "t")]);
        sign_as_cluster(&broker, &mut delete);
        assert!(verify_cluster_call(&broker, &delete).is_err());
        Ok(())
    }

    #[test]
    fn clients_up_to_4_9_3_sign_without_the_unique_key_query_flag() {
        let mut c = cmd(12, &[("topic", "t"), ("_UNIQUE_KEY_QUERY", "true"), ("Signature", "s")]);
        c.version = 399;
        let old: Vec<&[u8]> = signed_content(&c).collect();
        assert_eq!(old, vec![b"t".as_slice(), b""]);
        c.version = 401;
        let new: Vec<&[u8]> = signed_content(&c).collect();
        assert_eq!(new, vec![b"true".as_slice(), b"t", b""]);
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
