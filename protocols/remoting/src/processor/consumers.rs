//! Clients and consumer groups: heartbeats, unregistering, connection loss and expiry, consumer lists.

use super::*;

impl RocketMq {
    pub(super) fn heartbeat(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let hb = match parse_heartbeat(&req.body).and_then(|hb| check_heartbeat(&hb).map(|()| hb)) {
            Ok(hb) => hb,
            Err(why) => {
                metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "malformed").increment(1);
                return self.reply(req, rs::SYSTEM_ERROR, Some(why.into()));
            }
        };
        // With authorization on, a consumer group and the topics it
        // subscribes to are READ for the client (Apache 5: SUB on each, retry
        // topics aside): else anyone could join a group and be handed queues
        // no one then pulls.
        let read = rokka_broker::acl::Operation::Read;
        let needs = hb.consumers.iter().flat_map(|cd| {
            std::iter::once((rokka_broker::acl::ResourceType::Group, cd.group.as_str(), read)).chain(
                cd.subscriptions
                    .iter()
                    .filter(|(topic, _, _, _)| !topic.starts_with("%RETRY%"))
                    .map(move |(topic, _, _, _)| rokka_broker::acl::rocketmq_topic(topic, read)),
            )
        });
        if let Some(remark) = crate::auth::check_needs(&self.broker, conn, req, needs) {
            return self.reply(req, crate::auth::NO_PERMISSION, Some(remark));
        }
        let client_id = hb.client_id;
        let principal = crate::auth::principal_of(&self.broker, conn, req);
        let now = self.now_ms();
        let mut changed = Vec::new();
        let mut retry_topics = Vec::new();
        let mut conflict: Option<String> = None;
        let max_clients = self.config.max_clients as usize;
        let max_groups = self.config.max_consumer_groups as usize;
        let max_per_client = self.config.max_groups_per_client as usize;
        let max_sub_bytes = usize::try_from(self.config.max_subscription_bytes).unwrap_or(usize::MAX);
        let mut refused: Option<String> = None;
        {
            let mut guard = self.clients();
            let c = &mut *guard;
            if max_clients > 0 && c.clients.len() >= max_clients && !c.clients.contains_key(&client_id) {
                drop(guard);
                metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "max_clients").increment(1);
                return self.reply(
                    req,
                    rs::SYSTEM_ERROR,
                    Some(format!("too many clients (rocketmq.max_clients = {max_clients})")),
                );
            }
            // A client id live on another connection as another principal
            // is not taken over (its groups, its locks, its transaction
            // checks would follow the newcomer; the same principal
            // reconnecting takes it, as before).
            if let Some(cl) = c.clients.get(&client_id) {
                if cl.principal != principal && cl.live_elsewhere(conn) {
                    drop(guard);
                    metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "client_id_in_use")
                        .increment(1);
                    return self.reply(
                        req,
                        crate::auth::NO_PERMISSION,
                        Some(format!(
                            "client id {client_id} is live on another connection as another principal"
                        )),
                    );
                }
            }
            let entry = c.clients.entry(client_id.clone()).or_insert_with(|| Client {
                conn: conn.clone(),
                language: req.language,
                version: req.version,
                last_seen_ms: now,
                consumer_groups: Default::default(),
                producer_groups: Default::default(),
                group_seen_ms: Default::default(),
                principal: principal.clone(),
            });
            entry.conn = conn.clone();
            entry.principal = principal;
            entry.language = req.language;
            entry.version = req.version;
            entry.last_seen_ms = now;
            // Producer groups only label the client; at most as many as
            // one heartbeat names (a later heartbeat replaces them).
            entry.producer_groups = hb.producer_groups.into_iter().collect();
            for cd in hb.consumers {
                let g = cd.group;
                if max_groups > 0 && c.groups.len() >= max_groups && !c.groups.contains_key(&g) {
                    metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "max_consumer_groups")
                        .increment(1);
                    refused = Some(format!(
                        "consumer group {g} refused: too many consumer groups (rocketmq.max_consumer_groups = {max_groups})"
                    ));
                    continue;
                }
                let member_of = c.clients.get(&client_id).map_or(0, |cl| cl.consumer_groups.len());
                let new_here = !c
                    .clients
                    .get(&client_id)
                    .is_some_and(|cl| cl.consumer_groups.contains(&g));
                if max_per_client > 0 && member_of >= max_per_client && new_here {
                    metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "max_groups_per_client")
                        .increment(1);
                    refused = Some(format!(
                        "consumer group {g} refused: client {client_id} is in too many groups (rocketmq.max_groups_per_client = {max_per_client})"
                    ));
                    continue;
                }
                if self.broker.membership().has_pop_consumers(&g, now as i64) {
                    // RocketMQ 5 clients consume this group by pop: a
                    // queue-owning consumer would get their messages again.
                    metrics::counter!("rokka_mixed_group_conflicts_total", "group" => g.clone(), "side" => "rocketmq")
                        .increment(1);
                    if c.leave_group(&g, &client_id) {
                        changed.push(g.clone());
                    }
                    conflict = Some(format!(
                        "consumer group {g} is consumed by pop (RocketMQ 5 gRPC clients); remoting consumers cannot join it while they are live"
                    ));
                    continue;
                }
                if self.broker.membership().is_consumer_protocol_group(&g) {
                    // Kafka KIP-848 members have the broker assign this
                    // group's partitions; a RocketMQ client allocating
                    // queues itself would consume them twice.
                    metrics::counter!("rokka_mixed_group_conflicts_total", "group" => g.clone(), "side" => "rocketmq")
                        .increment(1);
                    let was = c.leave_group(&g, &client_id);
                    if was {
                        changed.push(g.clone());
                    }
                    conflict = Some(format!(
                        "consumer group {g} has Kafka consumer-protocol (KIP-848) members; RocketMQ clients cannot join it"
                    ));
                    continue;
                }
                if let Some(cl) = c.clients.get_mut(&client_id) {
                    cl.consumer_groups.insert(g.clone());
                    cl.group_seen_ms.insert(g.clone(), now);
                }
                // A mixed group's members must agree on topics.
                let topics: BTreeSet<String> = cd
                    .subscriptions
                    .iter()
                    .map(|(t, _, _, _)| t)
                    .filter(|t| !t.starts_with("%RETRY%"))
                    .cloned()
                    .collect();
                let kafka = self.broker.membership().get(&g);
                // (Kafka members' topics are unknown until their first join completes.)
                if !kafka.kafka.is_empty()
                    && (kafka.kafka_subscriptions_differ
                        || (!kafka.kafka_topics.is_empty() && topics != kafka.kafka_topics))
                {
                    metrics::counter!("rokka_mixed_group_conflicts_total", "group" => g.clone(), "side" => "rocketmq")
                        .increment(1);
                    let was = c.leave_group(&g, &client_id);
                    if was {
                        changed.push(g.clone());
                    }
                    // Logged once per connection (the client heartbeats
                    // every 30 s, refused alike each time).
                    if conflict.is_none() && !conn.conflict_logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::warn!(group = g, client = client_id, rocketmq = ?topics, kafka = ?kafka.kafka_topics,
                            "RocketMQ consumer refused: its subscription differs from the group's Kafka members'");
                    }
                    conflict = Some(if kafka.kafka_subscriptions_differ {
                        format!("consumer group {g}: its Kafka members subscribe to different topics; RocketMQ clients cannot join it")
                    } else {
                        format!(
                            "consumer group {g}: subscription {topics:?} conflicts with its Kafka members' {:?}",
                            kafka.kafka_topics
                        )
                    });
                    continue;
                }
                let group = c.groups.entry(g.clone()).or_default();
                // The heartbeat's subscriptions replace the group's as
                // RocketMQ's ConsumerGroupInfo.updateSubscription does: a
                // topic a consumer dropped goes, a new one comes, and a
                // topic's expression is replaced only by a newer subVersion
                // (members of a rolling deploy with other tags do not flip
                // it at every heartbeat). Only a change of topics tells the
                // members to rebalance.
                let mut subs: std::collections::BTreeMap<String, Subscription> = cd
                    .subscriptions
                    .into_iter()
                    .map(|(topic, expression, expression_type, version)| {
                        (
                            topic,
                            Subscription {
                                expression,
                                expression_type,
                                version,
                            },
                        )
                    })
                    .collect();
                for (topic, sub) in subs.iter_mut() {
                    if let Some(old) = group.subscriptions.get(topic) {
                        if sub.version <= old.version {
                            *sub = old.clone();
                        }
                    }
                }
                // Within the subscriptions' byte budget (names and
                // expressions are the client's: each group kept its last
                // heartbeat's, 64 KiB an expression).
                let (old_bytes, new_bytes) = (
                    crate::clients::subscription_bytes(&group.subscriptions),
                    crate::clients::subscription_bytes(&subs),
                );
                let total = c.subscription_bytes.saturating_sub(old_bytes).saturating_add(new_bytes);
                if max_sub_bytes > 0 && new_bytes > old_bytes && total > max_sub_bytes {
                    if group.members.is_empty() {
                        c.groups.remove(&g);
                    }
                    if let Some(cl) = c.clients.get_mut(&client_id) {
                        if !c.groups.get(&g).is_some_and(|gr| gr.members.contains(&client_id)) {
                            cl.consumer_groups.remove(&g);
                            cl.group_seen_ms.remove(&g);
                        }
                    }
                    metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "max_subscription_bytes")
                        .increment(1);
                    refused = Some(format!(
                        "consumer group {g} refused: its subscriptions would pass rocketmq.max_subscription_bytes = {max_sub_bytes}"
                    ));
                    continue;
                }
                c.subscription_bytes = total;
                metrics::gauge!("rokka_rocketmq_subscription_bytes").set(total as f64);
                group.clustering = cd.clustering;
                let subs_changed = !group.subscriptions.keys().eq(subs.keys());
                group.subscriptions = subs;
                let joined_now = group.members.insert(client_id.clone());
                if group.clustering {
                    retry_topics.push(format!("%RETRY%{g}"));
                }
                if (joined_now || subs_changed) && group.clustering {
                    changed.push(g);
                }
            }
        }
        // As RocketMQ's broker does on a consumer heartbeat: the group's retry
        // topic (one queue) exists from then on, and so is in the routes.
        for t in retry_topics {
            // (This broker set's own: every set holds a group's retry queue.)
            if self.broker.topics().get(&t).is_none_or(|i| i.partitions == 0) {
                match self.broker.ensure_own_topic(&t, 1) {
                    // (Past broker.max_topics: counted, not logged at every heartbeat.)
                    Ok(_) | Err(rokka_broker::BrokerError::TooManyTopics(_)) => {}
                    Err(e) => tracing::warn!(topic = t, error = %e, "cannot create the retry topic"),
                }
            }
        }
        for g in changed {
            self.members_changed(&g, true);
        }
        if let Some(remark) = conflict.or(refused) {
            return self.reply(req, rs::SYSTEM_ERROR, Some(remark));
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields.set("IS_SUPPORT_HEART_BEAT_V2", "false");
        r.ext_fields.set("IS_SUB_CHANGE", "true");
        r
    }

    /// The group's RocketMQ members and topics (clustering groups only).
    pub(super) fn rocketmq_side(&self, group: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let c = self.clients();
        match c.groups.get(group) {
            Some(g) if g.clustering => (
                g.members.clone(),
                g.subscriptions
                    .keys()
                    .filter(|t| !t.starts_with("%RETRY%"))
                    .cloned()
                    .collect(),
            ),
            _ => (BTreeSet::new(), BTreeSet::new()),
        }
    }

    /// Tells the Kafka side of mixed groups, from now on, about membership
    /// changes here.
    pub fn start_mixed_listener(self: &Arc<Self>) {
        let mut events = self.broker.membership().rocketmq_events();
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(g) = events.recv().await {
                tracing::info!(group = g, "Kafka members changed: notifying the RocketMQ members");
                me.notify_ids_changed(&g);
            }
        });
    }

    /// Tells every member of `group` to rebalance (oneway, on its own
    /// connection), after reporting the group's RocketMQ side to the shared
    /// membership (which rebalances its Kafka members, if any).
    pub(super) fn notify_ids_changed(&self, group: &str) {
        self.members_changed(group, false);
    }

    /// [`Self::notify_ids_changed`]; `by_request`: a member joined or left
    /// by its own request (a heartbeat, an unregister) — then, as Apache's
    /// ConsumerManager, the members are told only if the group's config
    /// leaves notifyConsumerIdsChangedEnable on (they rebalance on their
    /// own timer anyway). A closed connection (as Apache's
    /// doChannelCloseEvent), an expired client (Apache tells none) or a
    /// change on the Kafka side of a mixed group is always told.
    fn members_changed(&self, group: &str, by_request: bool) {
        let (members, topics) = self.rocketmq_side(group);
        self.broker.membership().set_rocketmq(group, members, topics);
        if by_request && !self.broker.sub_groups().honoured(group).notify_ids_changed {
            return;
        }
        // Broadcasting consumers each read everything: nothing to
        // rebalance (Apache tells only clustering groups).
        if self.clients().groups.get(group).is_some_and(|g| !g.clustering) {
            return;
        }
        let conns = self.clients().member_conns(group);
        for c in conns {
            let mut n = RemotingCommand::request(rq::NOTIFY_CONSUMER_IDS_CHANGED, c.next_opaque());
            n.flag = FLAG_ONEWAY;
            n.version = self.config.server_version;
            n.ext_fields.set("consumerGroup", group);
            if c.send(n) {
                metrics::counter!("rokka_rocketmq_consumer_ids_changed_total").increment(1);
            }
        }
    }

    pub(super) fn unregister(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let Some(client_id) = req.ext_fields.get("clientID") else {
            return self.reply(req, rs::SYSTEM_ERROR, Some("clientID missing".into()));
        };
        let changed = {
            let mut c = self.clients();
            // A client live on another connection is not this one's to
            // take out of its group (any client could otherwise rebalance
            // a group at will by the ids GET_CONSUMER_LIST_BY_GROUP lists),
            // as LOCK_BATCH_MQ and HEART_BEAT hold.
            if c.clients.get(client_id).is_some_and(|cl| cl.live_elsewhere(conn)) {
                drop(c);
                return self.reply(
                    req,
                    crate::auth::NO_PERMISSION,
                    Some(format!("client {client_id} is registered on another connection")),
                );
            }
            match req.ext_fields.get("consumerGroup") {
                Some(g) if !g.is_empty() => {
                    let mut changed = Vec::new();
                    if c.leave_group(g, client_id) {
                        changed.push(g.to_string());
                    }
                    if let Some(cl) = c.clients.get_mut(client_id) {
                        cl.consumer_groups.remove(g);
                        cl.group_seen_ms.remove(g);
                    }
                    changed
                }
                _ => Vec::new(),
            }
        };
        for g in changed {
            self.members_changed(&g, true);
        }
        self.reply(req, rs::SUCCESS, None)
    }

    /// A closed connection drops the clients that used it.
    pub(super) fn drop_connection(&self, conn: &Conn) {
        let changed = {
            let mut c = self.clients();
            let gone: Vec<String> = c
                .clients
                .iter()
                .filter(|(_, cl)| cl.conn.peer == conn.peer && cl.conn.is_closed())
                .map(|(id, _)| id.clone())
                .collect();
            let mut changed = Vec::new();
            for id in gone {
                changed.extend(c.remove_client(&id));
            }
            changed
        };
        for g in changed {
            self.notify_ids_changed(&g);
        }
    }

    /// Drops clients silent for longer than `client_timeout_ms`.
    pub fn expire_clients(&self) {
        let now = self.now_ms();
        let timeout = self.config.client_timeout_ms;
        let changed = {
            let mut c = self.clients();
            let gone: Vec<String> = c
                .clients
                .iter()
                .filter(|(_, cl)| cl.last_seen_ms + timeout < now)
                .map(|(id, _)| id.clone())
                .collect();
            let mut changed = Vec::new();
            for id in gone {
                tracing::info!(client = id, "RocketMQ client expired");
                changed.extend(c.remove_client(&id));
            }
            // Groups a live client's heartbeats stopped naming.
            let stale: Vec<(String, String)> = c
                .clients
                .iter()
                .flat_map(|(id, cl)| {
                    cl.consumer_groups
                        .iter()
                        .filter(|g| cl.group_seen_ms.get(*g).is_some_and(|at| at + timeout < now))
                        .map(move |g| (id.clone(), g.clone()))
                })
                .collect();
            for (id, g) in stale {
                tracing::info!(
                    client = id,
                    group = g,
                    "RocketMQ client left a group its heartbeats no longer name"
                );
                if c.leave_group(&g, &id) {
                    changed.push(g.clone());
                }
                if let Some(cl) = c.clients.get_mut(&id) {
                    cl.consumer_groups.remove(&g);
                    cl.group_seen_ms.remove(&g);
                }
            }
            metrics::gauge!("rokka_rocketmq_clients").set(c.clients.len() as f64);
            metrics::gauge!("rokka_rocketmq_consumer_groups").set(c.groups.len() as f64);
            changed
        };
        for g in changed {
            self.notify_ids_changed(&g);
        }
    }

    pub(super) fn consumer_list(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        // A mixed group lists its Kafka members too: RocketMQ clients then
        // leave those members' share of the queues alone.
        let mut ids: BTreeSet<String> = self
            .clients()
            .groups
            .get(group)
            .map(|g| g.members.iter().cloned().collect())
            .unwrap_or_default();
        if !ids.is_empty() {
            self.broker
                .membership()
                .with_group(group, |m| ids.extend(m.kafka.iter().cloned()));
        }
        if ids.is_empty() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("no consumer for this group, {group}")),
            );
        }
        self.json_body(req, json!({"consumerIdList": ids}))
    }
}

/// What the broker reads from a HEART_BEAT body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub client_id: String,
    /// `producerDataSet[].groupName`.
    pub producer_groups: Vec<String>,
    /// `consumerDataSet[]` entries that name their group.
    pub consumers: Vec<HeartbeatConsumer>,
}

/// One `consumerDataSet` entry of a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatConsumer {
    pub group: String,
    /// False for BROADCASTING (by name, or ordinal 0 as C++ clients send it).
    pub clustering: bool,
    /// (topic, expression, expression type, subVersion) of each
    /// subscription naming a topic; the expression defaults to `*`, the type
    /// to `TAG`, the version to 0.
    pub subscriptions: Vec<(String, String, String, i64)>,
}

/// Parses a HEART_BEAT body; the error is the response's remark.
/// Longest client id or group a heartbeat may name (RocketMQ's clients
/// check 255 characters).
const MAX_HEARTBEAT_NAME: usize = 255;
/// Longest topic a subscription may name: a retry topic is its group's
/// name with a prefix, a pop retry topic `%RETRY%<group>+<topic>`.
const MAX_HEARTBEAT_TOPIC: usize = 512;
/// Most groups, and subscriptions per group, one heartbeat may name.
const MAX_HEARTBEAT_ENTRIES: usize = 1000;
/// Most subscriptions one heartbeat may name over all its groups (a
/// process with a hundred consumers of ten topics each sends 1 000).
const MAX_HEARTBEAT_SUBSCRIPTIONS: usize = 10_000;
/// Longest subscription expression.
const MAX_EXPRESSION: usize = 64 << 10;

/// A heartbeat's names within what a RocketMQ client sends: a broker keeps
/// them (per client, per group), so a heartbeat may not make it keep more.
pub fn check_heartbeat(hb: &Heartbeat) -> Result<(), &'static str> {
    let name_ok = |n: &str| !n.is_empty() && n.len() <= MAX_HEARTBEAT_NAME;
    if !name_ok(&hb.client_id) {
        return Err("heartbeat clientID is empty or longer than 255 bytes");
    }
    if hb.consumers.len() > MAX_HEARTBEAT_ENTRIES || hb.producer_groups.len() > MAX_HEARTBEAT_ENTRIES {
        return Err("heartbeat names more than 1000 groups");
    }
    if !hb.producer_groups.iter().all(|g| name_ok(g)) {
        return Err("heartbeat producer group is empty or longer than 255 bytes");
    }
    for c in &hb.consumers {
        if !name_ok(&c.group) {
            return Err("heartbeat consumer group is empty or longer than 255 bytes");
        }
        if c.subscriptions.len() > MAX_HEARTBEAT_ENTRIES {
            return Err("heartbeat group has more than 1000 subscriptions");
        }
        for (topic, expression, kind, _) in &c.subscriptions {
            if topic.is_empty()
                || topic.len() > MAX_HEARTBEAT_TOPIC
                || expression.len() > MAX_EXPRESSION
                || kind.len() > MAX_HEARTBEAT_NAME
            {
                return Err("heartbeat subscription topic longer than 512 bytes or expression longer than 64 KiB");
            }
        }
    }
    Ok(())
}

/// A HEART_BEAT body as clients send it: typed, so a body of many small
/// objects costs about its own size (a generic JSON value cost ~100 times
/// it: a hostile 16 MiB body took 1.5 GiB); unknown fields are skipped.
mod hb_wire {
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Body {
        #[serde(rename = "clientID")]
        pub client_id: Option<String>,
        #[serde(rename = "producerDataSet", default)]
        pub producers: Bounded<Producer>,
        #[serde(rename = "consumerDataSet", default)]
        pub consumers: Bounded<Consumer>,
    }

    /// A list of at most [`super::MAX_HEARTBEAT_ENTRIES`] + 1 entries: one
    /// past it is refused while it is read (the check after says so), so a
    /// list of many tiny objects is not built first.
    pub struct Bounded<T>(pub Vec<T>);

    impl<T> Default for Bounded<T> {
        fn default() -> Self {
            Bounded(Vec::new())
        }
    }

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bounded<T> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bounded<T>, D::Error> {
            struct V<T>(std::marker::PhantomData<T>);
            impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
                type Value = Bounded<T>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a list")
                }
                fn visit_unit<E: serde::de::Error>(self) -> Result<Bounded<T>, E> {
                    Ok(Bounded(Vec::new()))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Bounded<T>, A::Error> {
                    let mut out = Vec::new();
                    while let Some(x) = a.next_element::<T>()? {
                        if out.len() > super::MAX_HEARTBEAT_ENTRIES {
                            return Err(serde::de::Error::custom("more than 1000 entries"));
                        }
                        out.push(x);
                    }
                    Ok(Bounded(out))
                }
            }
            d.deserialize_any(V(std::marker::PhantomData))
        }
    }

    #[derive(Deserialize)]
    pub struct Producer {
        #[serde(rename = "groupName")]
        pub group: Option<String>,
    }

    #[derive(Deserialize)]
    pub struct Consumer {
        #[serde(rename = "groupName")]
        pub group: Option<String>,
        #[serde(rename = "messageModel", default)]
        pub model: Model,
        #[serde(rename = "subscriptionDataSet", default)]
        pub subscriptions: Subscriptions,
    }

    thread_local! {
        /// Subscriptions read so far in the heartbeat being parsed.
        pub static READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A group's subscriptions: at most MAX_HEARTBEAT_ENTRIES per group and
    /// [`super::MAX_HEARTBEAT_SUBSCRIPTIONS`] over the whole heartbeat,
    /// refused while read.
    #[derive(Default)]
    pub struct Subscriptions(pub Vec<Subscription>);

    impl<'de> Deserialize<'de> for Subscriptions {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Subscriptions, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Subscriptions;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a list of subscriptions")
                }
                fn visit_unit<E: serde::de::Error>(self) -> Result<Subscriptions, E> {
                    Ok(Subscriptions::default())
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Subscriptions, A::Error> {
                    let mut out = Vec::new();
                    while let Some(x) = a.next_element::<Subscription>()? {
                        let total = READ.with(|r| {
                            r.set(r.get() + 1);
                            r.get()
                        });
                        if out.len() > super::MAX_HEARTBEAT_ENTRIES || total > super::MAX_HEARTBEAT_SUBSCRIPTIONS {
                            return Err(serde::de::Error::custom("too many subscriptions"));
                        }
                        out.push(x);
                    }
                    Ok(Subscriptions(out))
                }
            }
            d.deserialize_any(V)
        }
    }

    #[derive(Deserialize)]
    pub struct Subscription {
        pub topic: Option<String>,
        #[serde(rename = "subString")]
        pub expression: Option<String>,
        #[serde(rename = "expressionType")]
        pub kind: Option<String>,
        /// When the client made the subscription (ms): the newer one wins.
        #[serde(rename = "subVersion", default, deserialize_with = "lenient_i64")]
        pub version: Option<i64>,
    }

    /// A number, or anything else as none (a heartbeat is not refused for it).
    fn lenient_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(match v {
            serde_json::Value::Number(n) => n.as_i64(),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        })
    }

    /// `messageModel`: "BROADCASTING" / "CLUSTERING", or the enum's ordinal
    /// (0 broadcasting); anything else is clustering, skipped unbuffered.
    #[derive(Default)]
    pub struct Model {
        pub broadcasting: bool,
    }

    impl<'de> Deserialize<'de> for Model {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Model, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Model;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a message model")
                }
                fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Model, E> {
                    Ok(Model {
                        broadcasting: s == "BROADCASTING",
                    })
                }
                fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Model, E> {
                    Ok(Model { broadcasting: n == 0 })
                }
                fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Model, E> {
                    Ok(Model { broadcasting: n == 0 })
                }
                fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Model, E> {
                    Ok(Model::default())
                }
                fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Model, E> {
                    Ok(Model::default())
                }
                fn visit_unit<E: serde::de::Error>(self) -> Result<Model, E> {
                    Ok(Model::default())
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Model, A::Error> {
                    while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                    Ok(Model::default())
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Model, A::Error> {
                    while a
                        .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                        .is_some()
                    {}
                    Ok(Model::default())
                }
            }
            d.deserialize_any(V)
        }
    }
}

pub fn parse_heartbeat(body: &[u8]) -> Result<Heartbeat, &'static str> {
    hb_wire::READ.with(|r| r.set(0));
    let body: hb_wire::Body = serde_json::from_slice(body).map_err(|_| {
        "heartbeat body is not JSON, or names more than 1000 groups, 1000 subscriptions of a group or 10000 in all"
    })?;
    let client_id = body.client_id.ok_or("heartbeat without clientID")?;
    let producer_groups = body.producers.0.into_iter().filter_map(|p| p.group).collect();
    let consumers = body
        .consumers
        .0
        .into_iter()
        .filter_map(|cd| {
            let group = cd.group?;
            let subscriptions = cd
                .subscriptions
                .0
                .into_iter()
                .filter_map(|s| {
                    let topic = s.topic?;
                    let expression = s.expression.unwrap_or_else(|| "*".to_string());
                    let kind = s.kind.unwrap_or_else(|| "TAG".to_string());
                    Some((topic, expression, kind, s.version.unwrap_or(0)))
                })
                .collect();
            Some(HeartbeatConsumer {
                group,
                clustering: !cd.model.broadcasting,
                subscriptions,
            })
        })
        .collect();
    Ok(Heartbeat {
        client_id,
        producer_groups,
        consumers,
    })
}
