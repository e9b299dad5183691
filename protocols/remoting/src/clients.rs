//! Clients known from HEART_BEAT: consumer groups with their members and
//! subscriptions, producer groups, and each client's connection (for
//! NOTIFY_CONSUMER_IDS_CHANGED).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::command::LanguageCode;
use crate::server::Conn;

/// A subscription as a heartbeat carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub expression: String,
    pub expression_type: String,
    /// The client's subVersion (when it subscribed, ms).
    pub version: i64,
}

#[derive(Debug)]
pub struct Client {
    pub conn: Conn,
    /// What the client's heartbeat said it is written in (a C++ client
    /// takes RESET_CONSUMER_CLIENT_OFFSET's body in its own shape).
    pub language: LanguageCode,
    /// The client's remoting version (its heartbeat's).
    pub version: i32,
    pub last_seen_ms: u64,
    pub consumer_groups: BTreeSet<String>,
    pub producer_groups: BTreeSet<String>,
    /// When a heartbeat last named each of its consumer groups (ms): a
    /// group its heartbeats stopped naming (its consumer shut down, the
    /// unregister lost) is left after the client timeout, while the client
    /// lives on in its other groups (Apache's per-group channel expiry).
    pub group_seen_ms: std::collections::HashMap<String, u64>,
    /// Authorization on: who its heartbeat was signed as (transaction
    /// checks go only to a producer allowed to write the message's topic;
    /// its client id is not taken over by another principal).
    pub principal: Option<String>,
}

#[derive(Debug, Default)]
pub struct Group {
    pub members: BTreeSet<String>,
    /// topic → subscription (last heartbeat wins).
    pub subscriptions: BTreeMap<String, Subscription>,
    pub clustering: bool,
}

#[derive(Debug, Default)]
pub struct Clients {
    pub clients: HashMap<String, Client>,
    pub groups: BTreeMap<String, Group>,
    /// Bytes of every group's subscriptions ([`subscription_bytes`]),
    /// within `rocketmq.max_subscription_bytes`.
    pub subscription_bytes: usize,
}

/// What a group's subscriptions cost to keep: their topics, expressions
/// and kinds, and a little for each entry.
pub fn subscription_bytes(subs: &BTreeMap<String, Subscription>) -> usize {
    subs.iter()
        .map(|(t, s)| t.len() + s.expression.len() + s.expression_type.len() + 64)
        .sum()
}

impl Client {
    /// Whether the client is live on a connection other than `conn`: such
    /// a client id is not `conn`'s to act for (lock or unlock its queues,
    /// take it out of its groups, take it over as another principal).
    pub fn live_elsewhere(&self, conn: &Conn) -> bool {
        self.conn.peer != conn.peer && !self.conn.is_closed()
    }
}

impl Clients {
    /// Groups whose membership changed when `client_id` left (a group left
    /// without members is forgotten: its name came from a client).
    pub fn remove_client(&mut self, client_id: &str) -> Vec<String> {
        let mut changed = Vec::new();
        if let Some(cl) = self.clients.remove(client_id) {
            for name in &cl.consumer_groups {
                if self.leave_group(name, client_id) {
                    changed.push(name.clone());
                }
            }
        }
        changed
    }

    /// Takes `client_id` out of `group`; whether it was a member. A group
    /// left without members is forgotten.
    pub fn leave_group(&mut self, group: &str, client_id: &str) -> bool {
        let Some(g) = self.groups.get_mut(group) else {
            return false;
        };
        let was = g.members.remove(client_id);
        if g.members.is_empty() {
            if let Some(g) = self.groups.remove(group) {
                self.subscription_bytes = self
                    .subscription_bytes
                    .saturating_sub(subscription_bytes(&g.subscriptions));
                metrics::gauge!("rokka_rocketmq_subscription_bytes").set(self.subscription_bytes as f64);
            }
        }
        was
    }

    /// Connections of a group's members.
    pub fn member_conns(&self, group: &str) -> Vec<Conn> {
        self.groups
            .get(group)
            .map(|g| {
                g.members
                    .iter()
                    .filter_map(|m| self.clients.get(m))
                    .map(|c| c.conn.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}
