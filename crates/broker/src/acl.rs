//! One authorization model for every protocol: Kafka's ACLs (principal,
//! resource type and pattern, operation, allow or deny, host), kept in one
//! table that the Kafka admin API manages (CreateAcls, DescribeAcls,
//! DeleteAcls) and that Kafka requests and RocketMQ requests are both
//! checked against — a RocketMQ PUB is a WRITE on the topic, a SUB a READ
//! on the topic and the consumer group. Kept in
//! `<data_dir>/config/acls.json`, written whole and atomically on change.
//!
//! The rules are Kafka's (`StandardAuthorizer`): super users may do
//! everything; a matching DENY wins over any ALLOW; ALL matches every
//! operation; READ, WRITE, DELETE and ALTER imply DESCRIBE, ALTER_CONFIGS
//! implies DESCRIBE_CONFIGS (for ALLOW only); a resource no ACL names at
//! all is allowed only with `allow_everyone_if_no_acl_found`. With
//! authorization off (the default) every request is allowed.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The one name Kafka's CLUSTER resource has.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The principal of a client that did not authenticate.
pub const ANONYMOUS: &str = "User:ANONYMOUS";
/// A literal resource name or principal name matching every one.
pub const WILDCARD: &str = "*";

/// Kafka's resource types (`ResourceType`), with their wire codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
    DelegationToken,
    User,
}

impl ResourceType {
    pub const ALL: [ResourceType; 6] = [
        ResourceType::Topic,
        ResourceType::Group,
        ResourceType::Cluster,
        ResourceType::TransactionalId,
        ResourceType::DelegationToken,
        ResourceType::User,
    ];

    pub fn code(self) -> i8 {
        match self {
            ResourceType::Topic => 2,
            ResourceType::Group => 3,
            ResourceType::Cluster => 4,
            ResourceType::TransactionalId => 5,
            ResourceType::DelegationToken => 6,
            ResourceType::User => 7,
        }
    }

    pub fn from_code(c: i8) -> Option<ResourceType> {
        ResourceType::ALL.into_iter().find(|t| t.code() == c)
    }

    /// A short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            ResourceType::Topic => "topic",
            ResourceType::Group => "group",
            ResourceType::Cluster => "cluster",
            ResourceType::TransactionalId => "transactional_id",
            ResourceType::DelegationToken => "delegation_token",
            ResourceType::User => "user",
        }
    }
}

/// How an ACL's resource name matches (`PatternType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PatternType {
    Literal,
    Prefixed,
}

impl PatternType {
    pub fn code(self) -> i8 {
        match self {
            PatternType::Literal => 3,
            PatternType::Prefixed => 4,
        }
    }
}

/// Kafka's ACL operations (`AclOperation`), with their wire codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
    CreateTokens,
    DescribeTokens,
}

impl Operation {
    pub const EVERY: [Operation; 13] = [
        Operation::All,
        Operation::Read,
        Operation::Write,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Describe,
        Operation::ClusterAction,
        Operation::DescribeConfigs,
        Operation::AlterConfigs,
        Operation::IdempotentWrite,
        Operation::CreateTokens,
        Operation::DescribeTokens,
    ];

    pub fn code(self) -> i8 {
        Operation::EVERY
            .iter()
            .position(|o| *o == self)
            .map_or(0, |i| i as i8 + 2)
    }

    pub fn from_code(c: i8) -> Option<Operation> {
        (c >= 2)
            .then(|| Operation::EVERY.get((c - 2) as usize).copied())
            .flatten()
    }

    /// Whether an ALLOW of `self` allows `wanted` (Kafka's implied
    /// operations).
    fn allows(self, wanted: Operation) -> bool {
        self == Operation::All
            || self == wanted
            || (wanted == Operation::Describe
                && matches!(
                    self,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                ))
            || (wanted == Operation::DescribeConfigs && self == Operation::AlterConfigs)
    }
}

/// ALLOW or DENY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Permission {
    Deny,
    Allow,
}

impl Permission {
    pub fn code(self) -> i8 {
        match self {
            Permission::Deny => 2,
            Permission::Allow => 3,
        }
    }
}

/// One ACL (Kafka's `AclBinding`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Acl {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern: PatternType,
    /// `Type:name`, e.g. `User:alice`; `User:*` is every user.
    pub principal: String,
    /// The client's IP address as text, or `*`.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// Which pattern types a filter matches (Kafka's ANY, MATCH, LITERAL,
/// PREFIXED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternFilter {
    /// Patterns of either type whose name equals the filter's.
    Any,
    /// Patterns that would apply to the filter's name (literal equal or
    /// `*`, prefixes of it).
    Match,
    Only(PatternType),
}

/// An ACL filter (Kafka's `AclBindingFilter`); `None` fields match any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

impl AclFilter {
    /// Decodes a filter from Kafka's wire codes; `Err` names the bad field.
    #[allow(clippy::too_many_arguments)]
    pub fn from_wire(
        resource_type: i8,
        name: Option<&str>,
        pattern: i8,
        principal: Option<&str>,
        host: Option<&str>,
        operation: i8,
        permission: i8,
    ) -> std::result::Result<AclFilter, String> {
        Ok(AclFilter {
            resource_type: match resource_type {
                1 => None,
                c => Some(ResourceType::from_code(c).ok_or_else(|| format!("unknown resource type {c}"))?),
            },
            name: name.map(str::to_string),
            pattern: match pattern {
                1 => PatternFilter::Any,
                2 => PatternFilter::Match,
                3 => PatternFilter::Only(PatternType::Literal),
                4 => PatternFilter::Only(PatternType::Prefixed),
                c => return Err(format!("unknown pattern type {c}")),
            },
            principal: principal.map(str::to_string),
            host: host.map(str::to_string),
            operation: match operation {
                1 => None,
                c => Some(Operation::from_code(c).ok_or_else(|| format!("unknown operation {c}"))?),
            },
            permission: match permission {
                1 => None,
                2 => Some(Permission::Deny),
                3 => Some(Permission::Allow),
                c => return Err(format!("unknown permission type {c}")),
            },
        })
    }

    pub fn matches(&self, a: &Acl) -> bool {
        if self.resource_type.is_some_and(|t| t != a.resource_type)
            || self.principal.as_ref().is_some_and(|p| *p != a.principal)
            || self.host.as_ref().is_some_and(|h| *h != a.host)
            || self.operation.is_some_and(|o| o != a.operation)
            || self.permission.is_some_and(|p| p != a.permission)
        {
            return false;
        }
        match (&self.pattern, &self.name) {
            (PatternFilter::Only(t), _) if *t != a.pattern => false,
            (_, None) => true,
            (PatternFilter::Any | PatternFilter::Only(_), Some(n)) => *n == a.name,
            (PatternFilter::Match, Some(n)) => match a.pattern {
                PatternType::Literal => *n == a.name || a.name == WILDCARD,
                PatternType::Prefixed => n.starts_with(a.name.as_str()),
            },
        }
    }
}

/// How requests are authorized (`[security]` in the config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AclSettings {
    /// Check every request against the ACL table; false: allow all.
    pub enabled: bool,
    /// Principals (`User:name`) allowed everything.
    pub super_users: Vec<String>,
    /// A resource no ACL names is open to everyone (Kafka
    /// `allow.everyone.if.no.acl.found`).
    pub allow_everyone_if_no_acl_found: bool,
    /// At most this many ACLs in the table.
    pub max_acls: usize,
}

/// Why an ACL was not created (a Kafka error code and message, as for
/// credential changes).
pub use crate::users::Refused;

pub mod code {
    pub const INVALID_REQUEST: i16 = 42;
    pub use crate::users::code::POLICY_VIOLATION;
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    acls: Vec<Acl>,
}

/// Cluster mode: changes made here and not yet in etcd, and how many
/// changes were ever queued (each change's sequence number).
#[derive(Debug, Default)]
struct Pending {
    list: Vec<(Acl, bool)>,
    queued: u64,
}

/// The ACLs, sorted, and their index (always built together).
#[derive(Debug, Default)]
struct Table {
    acls: Vec<Acl>,
    /// `acls` by resource, for checks that do not scan the table.
    index: Index,
}

/// An ACL as a check needs it (host parsed, wildcards found).
#[derive(Debug)]
struct Compiled {
    principal: String,
    any_principal: bool,
    /// None: every host.
    host: Option<IpAddr>,
    operation: Operation,
    permission: Permission,
}

impl Compiled {
    fn of(a: &Acl) -> Compiled {
        Compiled {
            principal: a.principal.clone(),
            any_principal: is_wildcard_principal(&a.principal),
            host: (a.host != WILDCARD).then(|| a.host.parse().ok()).flatten(),
            operation: a.operation,
            permission: a.permission,
        }
    }

    fn applies_to(&self, principal: &str, host: IpAddr) -> bool {
        // (An IPv4 peer on a dual-stack listener arrives as ::ffff:a.b.c.d.)
        (self.any_principal || self.principal == principal)
            && self.host.is_none_or(|h| h.to_canonical() == host.to_canonical())
    }
}

/// ACLs by resource type and name: literal names (`*` among them) looked
/// up once, prefixes once per distinct prefix length (Kafka's authorizer
/// walks its sorted ACL set the same way).
#[derive(Debug, Default)]
struct Index {
    literal: HashMap<ResourceType, ByName>,
    /// The distinct prefix lengths, and the prefixes.
    prefixed: HashMap<ResourceType, (BTreeSet<usize>, ByName)>,
}

/// ACLs by resource name (or prefix).
type ByName = HashMap<String, Vec<Compiled>>;

impl Index {
    fn of(acls: &[Acl]) -> Index {
        let mut ix = Index::default();
        for a in acls {
            let c = Compiled::of(a);
            match a.pattern {
                PatternType::Literal => ix
                    .literal
                    .entry(a.resource_type)
                    .or_default()
                    .entry(a.name.clone())
                    .or_default()
                    .push(c),
                PatternType::Prefixed => {
                    let (lens, by_name) = ix.prefixed.entry(a.resource_type).or_default();
                    lens.insert(a.name.len());
                    by_name.entry(a.name.clone()).or_default().push(c);
                }
            }
        }
        ix
    }

    /// Every group of ACLs whose pattern matches `(rt, name)`, each with
    /// whether it names the resource literally (not by `*` or a prefix).
    fn matching<'a>(&'a self, rt: ResourceType, name: &'a str) -> impl Iterator<Item = (bool, &'a [Compiled])> + 'a {
        let literal = self.literal.get(&rt);
        let exact = literal.and_then(|m| m.get(name)).map(|g| (true, g.as_slice()));
        let wildcard = literal
            .and_then(|m| m.get(WILDCARD))
            .filter(|_| name != WILDCARD)
            .map(|g| (false, g.as_slice()));
        let prefixed = self.prefixed.get(&rt).into_iter().flat_map(move |(lens, by_name)| {
            lens.iter()
                .take_while(move |l| **l <= name.len())
                .filter_map(move |l| name.get(..*l).and_then(|p| by_name.get(p)))
                .map(|g| (false, g.as_slice()))
        });
        exact.into_iter().chain(wildcard).chain(prefixed)
    }
}

impl Table {
    fn new(acls: Vec<Acl>) -> Table {
        let index = Index::of(&acls);
        Table { acls, index }
    }
}

/// The ACL table and the settings it is checked with.
#[derive(Debug)]
pub struct Acls {
    path: PathBuf,
    table: RwLock<Table>,
    /// Writers take turns; checks are locked out only for the swap, not
    /// the fsync.
    writing: std::sync::Mutex<()>,
    settings: RwLock<AclSettings>,
    /// Cluster mode: ACLs added (true) or deleted (false) here and not yet
    /// written to the cluster's table (etcd); that table is not applied
    /// over them meanwhile.
    changes: std::sync::Mutex<Pending>,
    in_cluster: std::sync::atomic::AtomicBool,
    /// Cluster mode: how many changes etcd holds (of `Pending::queued`).
    written: crate::watermark::Watermark,
}

/// Whether `allow_everyone_if_no_acl_found` opens `(rt, name)` that no ACL
/// names: not the broker's own topics and groups (they hold every topic's
/// pending and delayed messages, and the broker's progress), and a retry or
/// dead-letter topic (copies of its group's messages) only as far as its
/// group is open — RocketMQ checks the group for them, whichever protocol
/// reads them.
fn open_if_no_acl(acls: &Acls, principal: &str, host: IpAddr, rt: ResourceType, name: &str) -> bool {
    match rt {
        ResourceType::Topic if crate::is_system_topic(name) => false,
        ResourceType::Group if crate::is_system_group(name) => false,
        ResourceType::Topic => match name.strip_prefix("%RETRY%").or_else(|| name.strip_prefix("%DLQ%")) {
            Some(g) => acls.authorize(principal, host, ResourceType::Group, g, Operation::Read),
            None => true,
        },
        _ => true,
    }
}

/// What a RocketMQ request on `topic` needs: `op` on the topic, but a
/// retry or dead-letter topic (`%RETRY%<group>`, `%DLQ%<group>`) is its
/// group's — READ on the group, as RocketMQ checks SUB on the group.
pub fn rocketmq_topic(topic: &str, op: Operation) -> (ResourceType, &str, Operation) {
    if let Some(g) = topic.strip_prefix("%RETRY%").or_else(|| topic.strip_prefix("%DLQ%")) {
        return (ResourceType::Group, g, Operation::Read);
    }
    (ResourceType::Topic, topic, op)
}

/// A principal as the table spells it: `User:` added to a bare name.
pub fn principal_of(s: &str) -> String {
    if s.contains(':') {
        s.to_string()
    } else {
        format!("User:{s}")
    }
}

/// Validates an ACL to create (Kafka's checks of a new ACL).
pub fn validate(a: &Acl) -> std::result::Result<(), Refused> {
    let bad = |m: String| {
        Err(Refused {
            code: code::INVALID_REQUEST,
            message: m,
        })
    };
    if a.name.is_empty() {
        return bad("resource name must not be empty".into());
    }
    if a.name.len() > 1024 || a.principal.len() > 1024 || a.host.len() > 256 {
        return bad("resource name, principal or host too long".into());
    }
    if a.resource_type == ResourceType::Cluster && a.name != CLUSTER_NAME {
        return bad(format!(
            "the only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        ));
    }
    if a.pattern == PatternType::Prefixed && a.name == WILDCARD {
        return bad("a PREFIXED pattern of '*' is not allowed; use LITERAL '*'".into());
    }
    match a.principal.split_once(':') {
        Some((t, n)) if !t.is_empty() && !n.is_empty() => {}
        _ => return bad(format!("principal {:?} is not of the form Type:name", a.principal)),
    }
    if a.host.is_empty() {
        return bad("host must not be empty (use '*')".into());
    }
    if a.host != WILDCARD && a.host.parse::<IpAddr>().is_err() {
        return bad(format!("host {:?} is neither '*' nor an IP address", a.host));
    }
    Ok(())
}

impl Acls {
    /// Loads `<data_dir>/config/acls.json` (absent = no ACLs).
    pub fn open(data_dir: &Path) -> Result<Acls> {
        let path = data_dir.join("config").join("acls.json");
        let file: File = crate::json_file::read_or_default(&path)?;
        let mut acls = file.acls;
        acls.retain(|a| match validate(a) {
            Ok(()) => true,
            Err(r) => {
                tracing::warn!(path = %path.display(), acl = ?a, reason = r.message, "ignoring a malformed ACL");
                false
            }
        });
        acls.sort();
        acls.dedup();
        metrics::gauge!("rokka_acls").set(acls.len() as f64);
        Ok(Acls {
            path,
            table: RwLock::new(Table::new(acls)),
            writing: std::sync::Mutex::default(),
            settings: RwLock::new(AclSettings {
                max_acls: 10_000,
                ..AclSettings::default()
            }),
            changes: std::sync::Mutex::default(),
            written: Default::default(),
            in_cluster: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn configure(&self, mut s: AclSettings) {
        s.super_users = s.super_users.iter().map(|p| principal_of(p)).collect();
        s.max_acls = s.max_acls.max(1);
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = s;
    }

    pub fn enabled(&self) -> bool {
        self.settings().enabled
    }

    fn settings(&self) -> std::sync::RwLockReadGuard<'_, AclSettings> {
        self.settings.read().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_super_user(&self, principal: &str) -> bool {
        self.settings().super_users.iter().any(|s| s == principal)
    }

    /// Whether `principal` from `host` may do `op` on the resource
    /// `(rt, name)`. Always true with authorization off.
    pub fn authorize(&self, principal: &str, host: IpAddr, rt: ResourceType, name: &str, op: Operation) -> bool {
        let s = self.settings();
        if !s.enabled || s.super_users.iter().any(|u| u == principal) {
            return true;
        }
        let allow_if_none = s.allow_everyone_if_no_acl_found;
        drop(s);
        // The broker's own topics and groups (its pending, delayed and
        // uncommitted messages, its delay and transaction-check progress)
        // are allowed only by an ACL naming them: a `*` or a prefix grant
        // (a mirror's READ on every group and topic) would let a client
        // commit the delay levels' progress past every pending delayed
        // message. A DENY of any pattern still counts.
        let own = match rt {
            ResourceType::Topic => crate::is_system_topic(name),
            ResourceType::Group => crate::is_system_group(name),
            _ => false,
        };
        let t = self.read();
        let mut any = false;
        let mut allowed = false;
        for (literal, group) in t.index.matching(rt, name) {
            any |= !group.is_empty();
            for a in group.iter().filter(|a| a.applies_to(principal, host)) {
                match a.permission {
                    Permission::Deny if a.operation == Operation::All || a.operation == op => return false,
                    Permission::Deny => {}
                    Permission::Allow if own && !literal => {}
                    Permission::Allow => allowed |= a.operation.allows(op),
                }
            }
        }
        allowed || (!any && allow_if_none && open_if_no_acl(self, principal, host, rt, name))
    }

    /// [`Acls::authorize`] of one RocketMQ need: CREATE of a topic is
    /// allowed by CREATE on the topic or on the cluster, as Kafka.
    pub fn allows(&self, principal: &str, host: IpAddr, (rt, name, op): (ResourceType, &str, Operation)) -> bool {
        self.authorize(principal, host, rt, name, op)
            || (rt == ResourceType::Topic
                && op == Operation::Create
                && self.authorize(principal, host, ResourceType::Cluster, CLUSTER_NAME, Operation::Create))
    }

    /// Whether `principal` may do `op` on some resource of type `rt`
    /// (Kafka's authorizeByResourceType: an idempotent producer needs WRITE
    /// on any topic): an ALLOW for it that no DENY of the same pattern
    /// cancels.
    pub fn authorize_any(&self, principal: &str, host: IpAddr, rt: ResourceType, op: Operation) -> bool {
        let s = self.settings();
        if !s.enabled || s.super_users.iter().any(|u| u == principal) {
            return true;
        }
        drop(s);
        // Kafka's Authorizer.authorizeByResourceType first authorizes a
        // name no ACL is likely to name ("hardcode"): allowed by a `*` or
        // an open resource (allow_everyone_if_no_acl_found).
        if self.authorize(principal, host, rt, "hardcode", op) {
            return true;
        }
        let t = self.read();
        let mine = |a: &&Acl| {
            a.resource_type == rt
                && (a.principal == principal || is_wildcard_principal(&a.principal))
                && (a.host == WILDCARD
                    || a.host
                        .parse::<IpAddr>()
                        .is_ok_and(|h| h.to_canonical() == host.to_canonical()))
        };
        let denied = |a: &Acl| {
            t.acls.iter().filter(mine).any(|d| {
                d.permission == Permission::Deny
                    && (d.operation == Operation::All || d.operation == op)
                    && ((d.pattern == PatternType::Literal && d.name == WILDCARD)
                        || (d.pattern == a.pattern && d.name == a.name)
                        || (d.pattern == PatternType::Prefixed && a.name.starts_with(d.name.as_str())))
            })
        };
        t.acls
            .iter()
            .filter(mine)
            .any(|a| a.permission == Permission::Allow && a.operation.allows(op) && !denied(a))
    }

    pub fn len(&self) -> usize {
        self.read().acls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ACLs `f` matches, in table order.
    pub fn describe(&self, f: &AclFilter) -> Vec<Acl> {
        self.read().acls.iter().filter(|a| f.matches(a)).cloned().collect()
    }

    /// Adds ACLs (one result per ACL, in order; an ACL already in the
    /// table is a success), then persists the table once.
    pub fn create(&self, new: Vec<Acl>) -> Vec<std::result::Result<(), Refused>> {
        let max = self.settings().max_acls;
        let _turn = self.turn();
        let mut next = self.read().acls.clone();
        let mut added = Vec::new();
        let results: Vec<_> = new
            .into_iter()
            .map(|a| {
                let r = validate(&a).and_then(|()| match next.binary_search(&a) {
                    Ok(_) => Ok(()),
                    Err(_) if next.len() >= max => Err(Refused {
                        code: code::POLICY_VIOLATION,
                        message: format!("at most {max} ACLs (security.max_acls)"),
                    }),
                    Err(i) => {
                        next.insert(i, a.clone());
                        added.push((a, true));
                        Ok(())
                    }
                });
                if r.is_err() {
                    metrics::counter!("rokka_acls_refused_total").increment(1);
                }
                r
            })
            .collect();
        if added.is_empty() {
            return results;
        }
        if let Err(e) = self.install(next, added) {
            let failed = Refused {
                code: code::UNKNOWN_SERVER_ERROR,
                message: format!("ACLs not stored: {e}"),
            };
            return results.into_iter().map(|r| r.and(Err(failed.clone()))).collect();
        }
        results
    }

    /// Deletes what each filter matches; per filter, the ACLs it deleted
    /// (an ACL matched by two filters is listed under the first).
    pub fn delete(&self, filters: &[AclFilter]) -> Result<Vec<Vec<Acl>>> {
        let _turn = self.turn();
        let current = self.read().acls.clone();
        let mut out = vec![Vec::new(); filters.len()];
        let mut kept = Vec::with_capacity(current.len());
        for a in current {
            match filters.iter().position(|f| f.matches(&a)) {
                Some(i) => out[i].push(a),
                None => kept.push(a),
            }
        }
        let gone: Vec<(Acl, bool)> = out.iter().flatten().map(|a| (a.clone(), false)).collect();
        if !gone.is_empty() {
            self.install(kept, gone)?;
        }
        Ok(out)
    }

    /// A writer's turn (see `writing`).
    fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `acls` (sorted) durably, then makes them the table checks
    /// see; `what` changed, for the cluster's table. Called in a turn.
    fn install(&self, acls: Vec<Acl>, what: Vec<(Acl, bool)>) -> Result<()> {
        #[derive(Serialize)]
        struct Out<'a> {
            acls: &'a [Acl],
        }
        crate::json_file::write(&self.path, &Out { acls: &acls }, true)?;
        if self.in_cluster.load(std::sync::atomic::Ordering::Acquire) && !what.is_empty() {
            let mut p = self.lock_changes();
            p.queued += what.len() as u64;
            p.list.extend(what);
        }
        metrics::gauge!("rokka_acls").set(acls.len() as f64);
        *self.write() = Table::new(acls);
        Ok(())
    }

    fn lock_changes(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cluster mode from now on: changes are kept for the cluster's table.
    pub fn join_cluster(&self) {
        self.in_cluster.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Cluster mode: ACLs added (true) or deleted (false) here since the
    /// last call, in order, to be written to etcd, and the sequence number
    /// of the last of them (for [`Acls::written_up_to`]).
    pub fn take_changes(&self) -> (Vec<(Acl, bool)>, u64) {
        let mut p = self.lock_changes();
        (std::mem::take(&mut p.list), p.queued)
    }

    /// Cluster mode: changes `take_changes` gave that did not reach etcd.
    pub fn rechange(&self, rest: Vec<(Acl, bool)>) {
        let mut p = self.lock_changes();
        let newer = std::mem::replace(&mut p.list, rest);
        p.list.extend(newer);
    }

    /// Cluster mode: etcd holds every change up to sequence number `seq`.
    pub fn written_up_to(&self, seq: u64) {
        self.written.advance(seq);
    }

    /// The sequence number of the last change made here (0 on a single
    /// node): what [`Acls::replicated`] waits for.
    pub fn last_change(&self) -> u64 {
        match self.in_cluster.load(std::sync::atomic::Ordering::Acquire) {
            true => self.lock_changes().queued,
            false => 0,
        }
    }

    /// Whether etcd holds every change up to `seq` within `within` (Kafka
    /// answers an ACL change once its metadata log has it); at once on a
    /// single node.
    pub async fn replicated(&self, seq: u64, within: std::time::Duration) -> bool {
        self.written.reached(seq, within).await
    }

    /// Cluster mode: the cluster's table replaces this node's, unless this
    /// node has changes of its own not yet written.
    pub fn replace_from_cluster(&self, acls: impl IntoIterator<Item = Acl>) -> Result<()> {
        let _turn = self.turn();
        if !self.lock_changes().list.is_empty() {
            return Ok(());
        }
        let mut acls: Vec<Acl> = acls.into_iter().filter(|a| validate(a).is_ok()).collect();
        acls.sort();
        acls.dedup();
        if self.read().acls == acls {
            return Ok(());
        }
        self.install(acls, Vec::new())
    }
}

/// The cluster table's key of an ACL: the same on every node (a digest of
/// its fields).
pub fn cluster_key(a: &Acl) -> String {
    let json = serde_json::to_vec(a).unwrap_or_default();
    let d = ring::digest::digest(&ring::digest::SHA256, &json);
    d.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// `User:*` (Kafka's only wildcard principal: `Group:*` names no one).
fn is_wildcard_principal(p: &str) -> bool {
    p == "User:*"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BrokerError;

    fn acl(rt: ResourceType, name: &str, pattern: PatternType, principal: &str, op: Operation, p: Permission) -> Acl {
        Acl {
            resource_type: rt,
            name: name.into(),
            pattern,
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            permission: p,
        }
    }

    fn on(dir: &Path) -> Acls {
        let a = Acls::open(dir).expect("open");
        a.configure(AclSettings {
            enabled: true,
            super_users: vec!["admin".into()],
            allow_everyone_if_no_acl_found: false,
            max_acls: 5,
        });
        a
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    /// With `allow_everyone_if_no_acl_found`, a retry or dead-letter topic
    /// no ACL names (copies of its group's messages, from any topic the
    /// group reads) is open only to who may read the group.
    #[test]
    fn retry_and_dead_letter_topics_are_as_open_as_their_group() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = on(dir.path());
        a.configure(AclSettings {
            enabled: true,
            allow_everyone_if_no_acl_found: true,
            max_acls: 5,
            ..AclSettings::default()
        });
        use ResourceType::*;
        let carol = "User:carol";
        a.create(vec![acl(
            Group,
            "orders-g",
            PatternType::Literal,
            carol,
            Operation::Read,
            Permission::Allow,
        )]);
        for t in ["%RETRY%orders-g", "%DLQ%orders-g"] {
            assert!(!a.authorize("User:alice", LOCAL, Topic, t, Operation::Read), "{t}");
            assert!(a.authorize(carol, LOCAL, Topic, t, Operation::Read), "{t}");
        }
        // A group no ACL names is open, and so are its topics; the
        // broker's own groups are not.
        assert!(a.authorize("User:alice", LOCAL, Topic, "%DLQ%other", Operation::Read));
        assert!(!a.authorize("User:alice", LOCAL, Group, "CID_RMQ_SYS_TRANS", Operation::Read));
        assert!(!a.authorize("User:alice", LOCAL, Group, "%SCHEDULE%", Operation::Read));
        assert!(a.authorize("User:alice", LOCAL, Topic, "plain", Operation::Read));
    }

    /// A grant on every group and topic (`*`, or a prefix) does not reach
    /// the broker's own: a principal reading everything cannot commit the
    /// delay levels' progress (`%SCHEDULE%`) or write the half topic. An
    /// ACL naming one literally does; a DENY of any pattern still counts.
    #[test]
    fn wildcard_and_prefix_grants_do_not_reach_the_brokers_own_groups_and_topics() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = on(dir.path());
        use Operation::*;
        use PatternType::*;
        use Permission::*;
        use ResourceType::*;
        let mirror = "User:mirror";
        let r = a.create(vec![
            acl(Group, "*", Literal, "User:*", Read, Allow),
            acl(Topic, "*", Literal, mirror, All, Allow),
            acl(Group, "CID_", Prefixed, mirror, Read, Allow),
        ]);
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        assert!(a.authorize(mirror, LOCAL, Group, "orders-g", Read));
        assert!(a.authorize(mirror, LOCAL, Topic, "orders", Write));
        assert!(!a.authorize(mirror, LOCAL, Group, "%SCHEDULE%", Read));
        assert!(!a.authorize(mirror, LOCAL, Group, "CID_RMQ_SYS_TRANS", Read));
        assert!(!a.authorize(mirror, LOCAL, Topic, "SCHEDULE_TOPIC_XXXX", Write));
        assert!(!a.authorize(mirror, LOCAL, Topic, "RMQ_SYS_TRANS_HALF_TOPIC", Write));
        let r = a.create(vec![acl(Group, "%SCHEDULE%", Literal, mirror, Read, Allow)]);
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        assert!(a.authorize(mirror, LOCAL, Group, "%SCHEDULE%", Read), "named literally");
        let r = a.create(vec![acl(Group, "*", Literal, mirror, Read, Deny)]);
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        assert!(
            !a.authorize(mirror, LOCAL, Group, "%SCHEDULE%", Read),
            "a DENY of `*` wins"
        );
    }

    #[test]
    fn kafka_rules_deny_wins_implied_describe_prefixes_and_super_users() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = on(dir.path());
        use Operation::*;
        use PatternType::*;
        use Permission::*;
        use ResourceType::*;
        let alice = "User:alice";
        assert!(
            !a.authorize(alice, LOCAL, Topic, "orders", Read),
            "nothing allowed by default"
        );
        assert!(a.authorize("User:admin", LOCAL, Topic, "orders", Delete), "super user");
        let r = a.create(vec![
            acl(Topic, "ord", Prefixed, alice, Read, Allow),
            acl(Topic, "orders-secret", Literal, alice, All, Deny),
            acl(Group, "*", Literal, "User:*", Read, Allow),
            acl(Topic, "pay", Literal, alice, AlterConfigs, Allow),
        ]);
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        assert!(a.authorize(alice, LOCAL, Topic, "orders", Read));
        assert!(
            a.authorize(alice, LOCAL, Topic, "orders", Describe),
            "READ implies DESCRIBE"
        );
        assert!(!a.authorize(alice, LOCAL, Topic, "orders", Write));
        assert!(!a.authorize(alice, LOCAL, Topic, "orders-secret", Read), "DENY wins");
        assert!(
            !a.authorize(alice, LOCAL, Topic, "or", Read),
            "a prefix longer than the name"
        );
        assert!(
            a.authorize("User:bob", LOCAL, Group, "g1", Read),
            "wildcard name and principal"
        );
        assert!(!a.authorize("User:bob", LOCAL, Topic, "orders", Read));
        assert!(a.authorize(alice, LOCAL, Topic, "pay", DescribeConfigs));
        assert!(!a.authorize(alice, LOCAL, Topic, "pay", Describe));
        assert!(a.authorize_any(alice, LOCAL, Topic, Read));
        assert!(!a.authorize_any(alice, LOCAL, Topic, Write));
        // Host-specific.
        a.create(vec![Acl {
            host: "10.0.0.1".into(),
            ..acl(Topic, "hosted", Literal, alice, Write, Allow)
        }]);
        assert!(!a.authorize(alice, LOCAL, Topic, "hosted", Write));
        assert!(a.authorize(alice, "10.0.0.1".parse().expect("ip"), Topic, "hosted", Write));
        // The same peer on a dual-stack listener (IPv4-mapped).
        assert!(a.authorize(alice, "::ffff:10.0.0.1".parse().expect("ip"), Topic, "hosted", Write));
        // The budget.
        let r = a.create(vec![acl(Topic, "x", Literal, alice, Read, Allow)]);
        assert_eq!(r[0].as_ref().map_err(|e| e.code), Err(code::POLICY_VIOLATION));
        // No ACL names it: open only if configured so.
        assert!(!a.authorize(alice, LOCAL, Topic, "unnamed", Read));
        a.configure(AclSettings {
            enabled: true,
            allow_everyone_if_no_acl_found: true,
            max_acls: 5,
            ..AclSettings::default()
        });
        assert!(a.authorize(alice, LOCAL, Topic, "unnamed", Read));
        assert!(
            !a.authorize("User:bob", LOCAL, Topic, "orders", Read),
            "named, so not open"
        );
        // The broker's own topics and groups are not open for it (every
        // topic's delayed and half messages, the broker's progress) ...
        for sys in ["SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_wheel_timer"] {
            assert!(!a.authorize(alice, LOCAL, Topic, sys, Read), "{sys}");
        }
        // ... (the broker's groups are open here: a wildcard ACL names
        // every group) and a retry or dead-letter topic no ACL names is as open as
        // its group (every group is, here: the wildcard).
        assert!(a.authorize(alice, LOCAL, Topic, "%DLQ%g1", Read));
        // WRITE on some topic (an idempotent producer's InitProducerId): an
        // open topic is one, as Kafka checks a hard-coded name first.
        assert!(a.authorize_any("User:bob", LOCAL, Topic, Write));
    }

    #[test]
    fn only_user_star_is_a_wildcard_principal() {
        assert!(is_wildcard_principal("User:*"));
        assert!(!is_wildcard_principal("Group:*"));
        assert!(!is_wildcard_principal("Foo:*"));
        assert!(!is_wildcard_principal("User:alice"));
    }

    #[test]
    fn filters_match_as_kafka_and_the_table_survives_a_restart() -> Result<()> {
        let dir = tempfile::tempdir().expect("tmp");
        use Operation::*;
        use PatternType::*;
        use Permission::*;
        use ResourceType::*;
        {
            let a = on(dir.path());
            let r = a.create(vec![
                acl(Topic, "ord", Prefixed, "User:alice", Read, Allow),
                acl(Topic, "orders", Literal, "User:alice", Write, Allow),
                acl(Topic, "*", Literal, "User:bob", Read, Allow),
                acl(Cluster, "wrong", Literal, "User:bob", Alter, Allow),
                acl(Topic, "t", Literal, "alice", Read, Allow),
            ]);
            assert_eq!(r.iter().filter(|r| r.is_ok()).count(), 3, "{r:?}");
        }
        let a = on(dir.path());
        assert_eq!(a.len(), 3, "persisted");
        let mut f = AclFilter::from_wire(2, Some("orders"), 2, None, None, 1, 1).map_err(|e| BrokerError::BadFile {
            path: PathBuf::new(),
            reason: e,
        })?;
        assert_eq!(a.describe(&f).len(), 3, "MATCH: literal, wildcard and prefix");
        f.pattern = PatternFilter::Any;
        assert_eq!(a.describe(&f).len(), 1, "ANY: the name itself");
        f.pattern = PatternFilter::Only(Prefixed);
        f.name = None;
        assert_eq!(a.describe(&f).len(), 1);
        let deleted = a.delete(&[AclFilter::from_wire(1, None, 1, Some("User:bob"), None, 1, 1).expect("filter")])?;
        assert_eq!(deleted[0].len(), 1);
        assert_eq!(on(dir.path()).len(), 2, "the deletion persisted");
        assert!(AclFilter::from_wire(9, None, 1, None, None, 1, 1).is_err());
        Ok(())
    }

    #[test]
    fn an_acl_that_cannot_be_stored_is_refused_and_not_applied() -> Result<()> {
        let dir = tempfile::tempdir().expect("tmp");
        let a = on(dir.path());
        let grant = acl(
            ResourceType::Topic,
            "t",
            PatternType::Literal,
            "User:alice",
            Operation::Read,
            Permission::Allow,
        );
        assert!(a.create(vec![grant.clone()])[0].is_ok());
        // The next write cannot make its temporary file (a directory is
        // in the way): refused, and neither checks nor the file change.
        let blocker = dir.path().join("config").join("acls.tmp");
        std::fs::create_dir_all(&blocker).map_err(|e| BrokerError::Io(blocker.clone(), e))?;
        let more = acl(
            ResourceType::Topic,
            "u",
            PatternType::Literal,
            "User:alice",
            Operation::Read,
            Permission::Allow,
        );
        let r = a.create(vec![more]);
        assert_eq!(r[0].as_ref().map_err(|e| e.code), Err(code::UNKNOWN_SERVER_ERROR));
        let local: IpAddr = "127.0.0.1".parse().expect("ip");
        assert!(!a.authorize("User:alice", local, ResourceType::Topic, "u", Operation::Read));
        assert!(a.authorize("User:alice", local, ResourceType::Topic, "t", Operation::Read));
        let everything = AclFilter::from_wire(1, None, 1, None, None, 1, 1).expect("filter");
        assert!(
            a.delete(&[everything]).is_err(),
            "a deletion that cannot be stored fails"
        );
        assert_eq!(a.len(), 1, "and deletes nothing");
        std::fs::remove_dir(&blocker).map_err(|e| BrokerError::Io(blocker.clone(), e))?;
        assert_eq!(on(dir.path()).len(), 1, "the file holds what the table holds");
        Ok(())
    }

    #[test]
    fn in_cluster_mode_a_change_waits_until_etcd_holds_it() -> Result<()> {
        let dir = tempfile::tempdir().expect("tmp");
        let a = on(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| BrokerError::Io(PathBuf::new(), e))?;
        let wait = std::time::Duration::from_millis(50);
        assert!(
            rt.block_on(a.replicated(a.last_change(), wait)),
            "a single node waits for nothing"
        );
        a.join_cluster();
        let grant = acl(
            ResourceType::Topic,
            "t",
            PatternType::Literal,
            "User:alice",
            Operation::Read,
            Permission::Allow,
        );
        assert!(a.create(vec![grant.clone()])[0].is_ok());
        let seq = a.last_change();
        assert_eq!(seq, 1);
        assert!(!rt.block_on(a.replicated(seq, wait)), "not in etcd yet");
        let (taken, upto) = a.take_changes();
        assert_eq!((taken, upto), (vec![(grant, true)], 1));
        a.written_up_to(upto);
        assert!(rt.block_on(a.replicated(seq, wait)));
        Ok(())
    }
}
