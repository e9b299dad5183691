//! Who a connection is, and what it may do: every request is checked
//! against the broker's one ACL table (`rokka_broker::acl`) before its
//! handler runs, with the operations Kafka's broker checks for it. A
//! request naming several topics, groups or resources has the ones the
//! caller may not touch taken out and answered with the API's own
//! authorization error (TOPIC_AUTHORIZATION_FAILED,
//! GROUP_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
//! CLUSTER_AUTHORIZATION_FAILED); the rest is served. Listing requests
//! (Metadata of all topics, ListGroups, ListTransactions) leave out what
//! the caller may not describe, as Kafka does.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use rokka_broker::acl::{Operation, ResourceType, ANONYMOUS, CLUSTER_NAME};

use crate::Kafka;

pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
pub const SECURITY_DISABLED: i16 = 54;
pub const OPERATION_NOT_ATTEMPTED: i16 = 55;

/// The client of one connection: its principal (`User:name`, or
/// `User:ANONYMOUS` until it authenticates) and address.
#[derive(Debug)]
pub struct Caller {
    principal: String,
    host: IpAddr,
    /// A denial is logged once per connection (then only counted).
    logged: AtomicBool,
}

impl Caller {
    pub fn new(host: IpAddr) -> Caller {
        Caller {
            principal: ANONYMOUS.to_string(),
            host,
            logged: AtomicBool::new(false),
        }
    }

    /// The connection authenticated as `user` (SASL) or presented a
    /// certificate naming it.
    pub fn authenticated(&mut self, user: &str) {
        self.principal = rokka_broker::acl::principal_of(user);
    }

    /// A principal as it stands (`User:CN=…` from a client certificate).
    pub fn set_principal(&mut self, principal: String) {
        self.principal = principal;
    }

    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// Whether authorization is on at all (off: every check passes, and
    /// callers skip their filtering).
    pub fn checked(&self, k: &Kafka) -> bool {
        k.broker.acls().enabled()
    }

    /// Whether the caller may do `op` on `(rt, name)`; a denial is counted
    /// and logged once per connection.
    pub fn may(&self, k: &Kafka, rt: ResourceType, name: &str, op: Operation) -> bool {
        let ok = self.sees(k, rt, name, op);
        if !ok {
            self.denied(rt, name, op);
        }
        ok
    }

    /// As [`Caller::may`], without counting a denial (for listings, which
    /// leave out what the caller may not see).
    pub fn sees(&self, k: &Kafka, rt: ResourceType, name: &str, op: Operation) -> bool {
        k.broker.acls().authorize(&self.principal, self.host, rt, name, op)
    }

    /// Kafka's authorized-operations field for `(rt, name)`: a bit (1 <<
    /// the operation's code) for each operation of the resource type the
    /// caller may do (every one with authorization off), as Kafka's
    /// AuthHelper answers an `include_*_authorized_operations` request.
    pub fn authorized_operations(&self, k: &Kafka, rt: ResourceType, name: &str) -> i32 {
        use Operation as O;
        let ops: &[Operation] = match rt {
            ResourceType::Topic => &[
                O::Read,
                O::Write,
                O::Create,
                O::Delete,
                O::Alter,
                O::Describe,
                O::DescribeConfigs,
                O::AlterConfigs,
            ],
            ResourceType::Group => &[O::Read, O::Describe, O::Delete],
            ResourceType::Cluster => &[
                O::Create,
                O::ClusterAction,
                O::DescribeConfigs,
                O::AlterConfigs,
                O::IdempotentWrite,
                O::Alter,
                O::Describe,
            ],
            _ => &[],
        };
        ops.iter()
            .filter(|op| self.sees(k, rt, name, **op))
            .fold(0, |bits, op| bits | (1 << op.code()))
    }

    pub fn cluster_operations(&self, k: &Kafka) -> i32 {
        self.authorized_operations(k, ResourceType::Cluster, CLUSTER_NAME)
    }

    pub fn may_cluster(&self, k: &Kafka, op: Operation) -> bool {
        self.may(k, ResourceType::Cluster, CLUSTER_NAME, op)
    }

    /// CREATE on the cluster or on the topic (Kafka's rule for creating
    /// one, explicitly or by auto-creation).
    pub fn may_create_topic(&self, k: &Kafka, name: &str) -> bool {
        self.sees(k, ResourceType::Cluster, CLUSTER_NAME, Operation::Create)
            || self.may(k, ResourceType::Topic, name, Operation::Create)
    }

    /// An idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE
    /// on some topic (Kafka 2.8+).
    pub fn may_write_idempotently(&self, k: &Kafka) -> bool {
        let acls = k.broker.acls();
        let ok = acls.authorize(
            &self.principal,
            self.host,
            ResourceType::Cluster,
            CLUSTER_NAME,
            Operation::IdempotentWrite,
        ) || acls.authorize_any(&self.principal, self.host, ResourceType::Topic, Operation::Write);
        if !ok {
            self.denied(ResourceType::Cluster, CLUSTER_NAME, Operation::IdempotentWrite);
        }
        ok
    }

    fn denied(&self, rt: ResourceType, name: &str, op: Operation) {
        metrics::counter!("rokka_authorization_denied_total", "protocol" => "kafka", "resource" => rt.label())
            .increment(1);
        if !self.logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                principal = self.principal.as_str(),
                host = %self.host,
                resource = rt.label(),
                name,
                operation = ?op,
                "Kafka request denied by the ACLs (further denials on this connection are only counted)"
            );
        }
    }
}

/// Takes out of `items` those `allowed` refuses, returned in order.
pub fn split_off<T>(items: &mut Vec<T>, mut allowed: impl FnMut(&T) -> bool) -> Vec<T> {
    // The usual case (everything allowed, or authorization off) moves
    // nothing.
    let Some(first) = items.iter().position(|it| !allowed(it)) else {
        return Vec::new();
    };
    let mut refused = Vec::new();
    let mut kept = Vec::with_capacity(items.len());
    for (i, it) in items.drain(..).enumerate() {
        if i < first || (i > first && allowed(&it)) {
            kept.push(it);
        } else {
            refused.push(it);
        }
    }
    *items = kept;
    refused
}
