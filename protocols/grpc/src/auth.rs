//! Authentication and authorization of RocketMQ 5 calls, against the one
//! users table and ACL table the Kafka and remoting listeners obey.
//!
//! A RocketMQ 5 client signs every call (Apache's `MQv2-HMAC-SHA1`): the
//! `authorization` header `MQv2-HMAC-SHA1 Credential=<AccessKey>,
//! SignedHeaders=x-mq-date-time, Signature=<hex>` carries the hex of an
//! HMAC-SHA1 of the `x-mq-date-time` header under the user's RocketMQ
//! secret. A verified call is `User:<AccessKey>`; one without credentials
//! (no header, or an empty Credential: the clients' default) is
//! `User:ANONYMOUS`; a wrong or unknown one is refused UNAUTHORIZED, and an
//! address that failed `grpc.auth_max_failures_per_address` times within
//! `grpc.auth_failure_window_ms` has its signed calls refused unchecked
//! for the rest of the window. The date is not checked against the clock:
//! the Python client stamps local time as if it were UTC.
//!
//! What each call needs follows the remoting mapping (docs/security.md):
//! sends and transaction ends WRITE on the topic (PUB), receives, acks and
//! offset commits READ on the topic and the group (SUB), offset and route
//! queries DESCRIBE, auto-creation CREATE. A refusal answers FORBIDDEN
//! naming what was missing, is counted, and is logged once per connection.
//! With `security.authorization` off nothing is checked.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use rokka_broker::acl::{Operation as Op, ResourceType as Rt, ANONYMOUS};
use rokka_broker::limits::AuthFailures;
use rokka_broker::Broker;
use tonic::metadata::MetadataMap;

use crate::pb;
use crate::GrpcConfig;

/// One (resource, operation) a call needs.
pub type Need<'a> = (Rt, &'a str, Op);

const SCHEME: &str = "MQv2-HMAC-SHA1";

/// Connections whose first refusal was logged, at most this many (then
/// forgotten, so a refusal may be logged again).
const MAX_LOGGED: usize = 10_000;

#[derive(Debug)]
pub struct Guard {
    failures: AuthFailures,
    logged: Mutex<HashSet<SocketAddr>>,
}

fn refusal(code: pb::Code, message: String) -> pb::Status {
    pb::Status {
        code: code as i32,
        message,
    }
}

/// Longest consumer group a call may name: its retry and dead-letter
/// topics (`%RETRY%<group>`, `%DLQ%<group>`) must be valid topic names
/// (Apache's clients: 120 characters, ILLEGAL_CONSUMER_GROUP); what a call
/// names the broker may keep (pop state per queue, consumers, renewals,
/// metric labels).
pub const MAX_GROUP_BYTES: usize = rokka_store::MAX_TOPIC_LEN - "%RETRY%".len();

/// A call naming a group or topic that cannot be, or that is the
/// broker's own, refused before anything is looked up or kept (with or
/// without authorization), as Apache's proxy (`GrpcValidator`): a group
/// whose dead-letter topic could not be written would keep its messages
/// in flight for good.
pub fn names_refused(needs: &[Need<'_>]) -> Option<pb::Status> {
    needs.iter().find_map(|(rt, name, _)| match rt {
        Rt::Group if name.len() > MAX_GROUP_BYTES => Some(refusal(
            pb::Code::IllegalConsumerGroup,
            format!("consumer group is longer than {MAX_GROUP_BYTES} bytes"),
        )),
        Rt::Group if !name.is_empty() && rokka_store::validate_topic(&format!("%DLQ%{name}")).is_err() => {
            Some(refusal(
                pb::Code::IllegalConsumerGroup,
                "consumer group may hold only ASCII letters, digits and ._-%|".into(),
            ))
        }
        Rt::Group if rokka_broker::is_system_group(name) => Some(refusal(
            pb::Code::IllegalConsumerGroup,
            "cannot use system consumer group".into(),
        )),
        Rt::Topic if name.len() > rokka_store::MAX_TOPIC_LEN => Some(refusal(
            pb::Code::IllegalTopic,
            format!("topic is longer than {} bytes", rokka_store::MAX_TOPIC_LEN),
        )),
        Rt::Topic if rokka_broker::is_system_topic(name) => {
            Some(refusal(pb::Code::IllegalTopic, "cannot access system topic".into()))
        }
        _ => None,
    })
}

/// Longest `x-mq-client-id` a call may carry (the clients send
/// `host@pid@index@random`, some tens of bytes): the broker keeps the id
/// with each pop consumer and auto-renewed message it names, and hyper
/// would take headers of up to 16 KiB.
pub const MAX_CLIENT_ID_BYTES: usize = 256;

/// A call whose client id is longer than [`MAX_CLIENT_ID_BYTES`], refused.
pub fn client_id_refused<T>(req: &tonic::Request<T>) -> Option<pb::Status> {
    let len = req.metadata().get("x-mq-client-id").map_or(0, |v| v.len());
    (len > MAX_CLIENT_ID_BYTES).then(|| {
        metrics::counter!("rokka_rocketmq5_requests_refused_total", "reason" => "client_id").increment(1);
        refusal(
            pb::Code::BadRequest,
            format!("x-mq-client-id is longer than {MAX_CLIENT_ID_BYTES} bytes"),
        )
    })
}

/// The parts of an `authorization` header: (AccessKey, Signature).
fn parse(header: &str) -> Option<(&str, &str)> {
    let rest = header.trim().strip_prefix(SCHEME)?;
    let (mut ak, mut sig) = (None, None);
    for part in rest.split(',') {
        match part.trim().split_once('=') {
            // `AccessKey/Region/Service` from the Go and C++ clients
            // (`ak//Rocketmq`): the user is before the first '/', as
            // Apache's DefaultAuthenticationContextBuilder splits it.
            Some(("Credential", v)) => ak = v.trim().split('/').next(),
            Some(("Signature", v)) => sig = Some(v.trim()),
            _ => {}
        }
    }
    Some((ak?, sig.unwrap_or_default()))
}

impl Guard {
    pub fn new(config: &GrpcConfig) -> Guard {
        Guard {
            failures: AuthFailures::new(
                "rokka_rocketmq5_auth_failing_addresses",
                config.auth_max_failures_per_address,
                Duration::from_millis(config.auth_failure_window_ms),
            ),
            logged: Mutex::new(HashSet::new()),
        }
    }

    /// The call's principal; Err: UNAUTHORIZED and why. Only asked with
    /// authorization on.
    /// A call without credentials is who its client certificate names
    /// (`certified`), or `User:ANONYMOUS`.
    pub fn principal(
        &self,
        broker: &Broker,
        md: &MetadataMap,
        peer: Option<SocketAddr>,
        certified: Option<&str>,
    ) -> Result<String, pb::Status> {
        let header = md.get("authorization").map(|v| v.to_str());
        let unsigned = || Ok(certified.unwrap_or(ANONYMOUS).to_string());
        let (ak, sig) = match header {
            None => return unsigned(),
            Some(Err(_)) => return Err(self.failed(peer, "signature", "authorization header is not text".into())),
            Some(Ok(h)) => match parse(h) {
                Some(("", _)) => return unsigned(),
                Some(p) => p,
                None => {
                    return Err(self.failed(
                        peer,
                        "signature",
                        format!("authorization header is not {SCHEME} Credential=..., Signature=..."),
                    ))
                }
            },
        };
        if peer.is_some_and(|p| self.failures.blocked(p.ip())) {
            metrics::counter!("rokka_rocketmq5_authentications_failed_total", "reason" => "held_off").increment(1);
            let ip = peer.map(|p| p.ip().to_string()).unwrap_or_default();
            return Err(refusal(
                pb::Code::Unauthorized,
                format!("too many failed authentications from {ip}: signed calls are refused for a while"),
            ));
        }
        let date_time = md
            .get("x-mq-date-time")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        match broker.users().check_rocketmq5_signature(ak, date_time, sig) {
            Ok(()) => Ok(format!("User:{ak}")),
            Err(why) => {
                if let Some(p) = peer {
                    self.failures.failed(p.ip());
                }
                Err(self.failed(
                    peer,
                    "signature",
                    format!("authentication of AccessKey {ak} failed: {why}"),
                ))
            }
        }
    }

    fn failed(&self, peer: Option<SocketAddr>, reason: &'static str, message: String) -> pb::Status {
        metrics::counter!("rokka_rocketmq5_authentications_failed_total", "reason" => reason).increment(1);
        self.log_once(peer, &message);
        refusal(pb::Code::Unauthorized, message)
    }

    fn log_once(&self, peer: Option<SocketAddr>, message: &str) {
        let Some(p) = peer else { return };
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.len() >= MAX_LOGGED {
            logged.clear();
        }
        if logged.insert(p) {
            tracing::warn!(peer = %p, message, "RocketMQ 5 call refused (further refusals on this connection are only counted)");
        }
    }

    /// Whether `who` may do every one of `needs`; Err: FORBIDDEN naming the
    /// first missing one.
    pub fn authorize(
        &self,
        broker: &Broker,
        who: &str,
        peer: Option<SocketAddr>,
        needs: &[Need<'_>],
    ) -> Result<(), pb::Status> {
        let host = peer.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
        let acls = broker.acls();
        for &(rt, name, op) in needs {
            if acls.allows(who, host, (rt, name, op)) {
                continue;
            }
            metrics::counter!("rokka_authorization_denied_total", "protocol" => "rocketmq5", "resource" => rt.label())
                .increment(1);
            let what = match (rt, op) {
                (Rt::Topic, Op::Write) => " (PUB)",
                (Rt::Topic, Op::Read) | (Rt::Group, Op::Read) => " (SUB)",
                _ => "",
            };
            let message = format!("no permission: {who} may not {op:?} {} {name}{what}", rt.label());
            self.log_once(peer, &message);
            return Err(refusal(pb::Code::Forbidden, message));
        }
        Ok(())
    }

    /// The caller's principal, `None` with authorization off (nothing is
    /// checked); Err: UNAUTHORIZED.
    pub fn who<T>(&self, broker: &Broker, req: &tonic::Request<T>) -> Result<Option<String>, pb::Status> {
        // Every call asks who it is from first: an oversized client id is
        // refused here, with or without authorization.
        if let Some(s) = client_id_refused(req) {
            return Err(s);
        }
        if !broker.acls().enabled() {
            return Ok(None);
        }
        self.principal(
            broker,
            req.metadata(),
            crate::peer(req),
            crate::certificate_principal(req),
        )
        .map(Some)
    }

    /// [`Guard::who`] then [`Guard::authorize`]: `None` if the call may go
    /// on (always with authorization off).
    pub fn check<T>(&self, broker: &Broker, req: &tonic::Request<T>, needs: &[Need<'_>]) -> Option<pb::Status> {
        if let Some(s) = names_refused(needs) {
            return Some(s);
        }
        match self.who(broker, req) {
            Ok(None) => None,
            Ok(Some(who)) => self.authorize(broker, &who, crate::peer(req), needs).err(),
            Err(s) => Some(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn names_longer_than_a_group_or_topic_can_be_are_refused() {
        use super::{names_refused, pb, Op, Rt};
        let g = "g".repeat(256);
        let t = "t".repeat(rokka_store::MAX_TOPIC_LEN + 1);
        let code = |needs: &[super::Need<'_>]| names_refused(needs).map(|s| s.code);
        assert_eq!(
            code(&[(Rt::Group, &g, Op::Read)]),
            Some(pb::Code::IllegalConsumerGroup as i32)
        );
        assert_eq!(code(&[(Rt::Topic, &t, Op::Write)]), Some(pb::Code::IllegalTopic as i32));
        assert_eq!(
            code(&[
                (Rt::Group, &g[..super::MAX_GROUP_BYTES], Op::Read),
                (Rt::Topic, "T", Op::Read)
            ]),
            None
        );
        // A group whose dead-letter topic could not be, the broker's own
        // groups and topics (Apache's GrpcValidator).
        for bad in ["a b", "a:b", "grüße"] {
            assert_eq!(
                code(&[(Rt::Group, bad, Op::Read)]),
                Some(pb::Code::IllegalConsumerGroup as i32),
                "{bad}"
            );
        }
        for sys in ["CID_RMQ_SYS_TRANS", "%SCHEDULE%"] {
            assert_eq!(
                code(&[(Rt::Group, sys, Op::Read)]),
                Some(pb::Code::IllegalConsumerGroup as i32)
            );
        }
        for sys in ["RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"] {
            assert_eq!(code(&[(Rt::Topic, sys, Op::Read)]), Some(pb::Code::IllegalTopic as i32));
        }
        assert_eq!(
            code(&[(Rt::Group, "g.1_a-%b|c", Op::Read), (Rt::Topic, "%DLQ%g", Op::Read)]),
            None
        );
    }

    #[test]
    fn the_clients_authorization_header_is_read() {
        let h = "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=0A1b";
        assert_eq!(parse(h), Some(("alice", "0A1b")));
        assert_eq!(
            parse("MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=ab"),
            Some(("", "ab"))
        );
        // The Go client's `ak//Rocketmq`, the C++ client's `ak/region/RocketMQ`.
        let go = "MQv2-HMAC-SHA1 Credential=alice//Rocketmq, SignedHeaders=x-mq-date-time, Signature=0A1b";
        assert_eq!(parse(go), Some(("alice", "0A1b")));
        let cpp = "MQv2-HMAC-SHA1 Credential=alice/cn-hangzhou/RocketMQ, SignedHeaders=x-mq-date-time, Signature=0A1b";
        assert_eq!(parse(cpp), Some(("alice", "0A1b")));
        assert_eq!(parse("Basic YWxpY2U6cHc="), None);
        assert_eq!(parse("MQv2-HMAC-SHA1 Signature=ab"), None);
    }
}
