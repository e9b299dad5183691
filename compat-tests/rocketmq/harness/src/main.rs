//! `rokka-rocketmq-compat <namesrv> <scenario>`: runs one scenario with the
//! real RocketMQ client against a running rokka and exits non-zero on any
//! mismatch. Scenarios: `send-consume` (sync sends with tags, then a push
//! consumer reads every message back byte-exact), `tag-filter` (a
//! `TagA || TagB` subscription gets exactly those tags; this client hashes
//! the untrimmed tokens, so the broker must derive codes from the expression),
//! `send-kinds` (sync, async with callback, oneway and batch sends, all read
//! back), `ordered` (queue-selector sends; an orderly consumer sees every
//! order's messages in its queue in send order, with keys and properties),
//! `group` (two, then three push consumers of one group split the queues,
//! then one leaves: nothing lost, nothing consumed twice), `lite-pull`
//! (a lite-pull consumer reads all and resumes at its committed offsets),
//! `resume-1`/`resume-2` (run around a rokka restart: the group resumes at
//! its committed offsets), `broadcast` (two broadcasting consumers each get
//! everything), `dying-member`/`takeover` (a consumer that dies without
//! shutting down, and the one that takes its queues over).
//!
//! Deliveries are counted, not collected into sets: in the single-consumer
//! scenarios (a fresh group, no rebalance) a duplicate is a broker bug, so
//! every message must arrive exactly once; where redelivery is the point
//! (retry-dlq) the exact number of attempts is checked.
//!
//! `COMPAT_FAULT=duplicate` (every delivery recorded twice), `drop` (the
//! first delivery not recorded) or `tx-linger` (`tx-restart-1` keeps its
//! producer 6 s, so the broker checks it before the restart) shows that a
//! scenario's checks can fail.

#![recursion_limit = "512"]

mod durability;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketmq_client_rust::{
    ClientConfig, ClientError, ClientResult, ClientRuntime, ClientRuntimeConfig, ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus, ConsumeOrderlyContext, ConsumeOrderlyStatus, DefaultLitePullConsumer, DefaultMQProducer,
    DefaultMQPushConsumer, MQPushConsumer, MessageListenerConcurrently, MessageListenerOrderly,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_protocol::protocol::heartbeat::message_model::MessageModel;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

/// RocketMQ ACL credentials from `COMPAT_ACCESS_KEY` and
/// `COMPAT_SECRET_KEY`: requests are then signed (AclClientRPCHook).
fn acl_hook() -> Option<Arc<rocketmq_client_rust::AclClientRPCHook>> {
    let ak = std::env::var("COMPAT_ACCESS_KEY").ok().filter(|k| !k.is_empty())?;
    let sk = std::env::var("COMPAT_SECRET_KEY").unwrap_or_default();
    Some(Arc::new(rocketmq_client_rust::AclClientRPCHook::new(
        rocketmq_client_rust::SessionCredentials::with_keys(ak, sk),
    )))
}

/// The client's connections (name server and brokers) over TLS when
/// `COMPAT_TLS_CA` names the CA to trust (the client checks the server's
/// certificate, tls.client.authServer, and that it names the address);
/// with `COMPAT_TLS_CERT` and `COMPAT_TLS_KEY` it presents a certificate
/// too. Otherwise plaintext, the client's defaults.
fn client_config() -> ClientConfig {
    let mut c = ClientConfig::default();
    if let Some(ca) = std::env::var("COMPAT_TLS_CA").ok().filter(|p| !p.is_empty()) {
        c.set_use_tls(true);
        c.set_tls_client_auth_server(true);
        c.tls_config.client.trust_cert_path = Some(ca);
        if let (Ok(cert), Ok(key)) = (std::env::var("COMPAT_TLS_CERT"), std::env::var("COMPAT_TLS_KEY")) {
            c.tls_config.client.cert_path = Some(cert);
            c.tls_config.client.key_path = Some(key);
        }
    }
    c
}

/// `create-user <broker> <name> <password>`: RocketMQ 5's AUTH_CREATE_USER
/// through the admin client (signed when credentials are set).
async fn create_user(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::AuthAdmin;
    let (Some(broker), Some(name), Some(password)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("compat: create-user <broker> <name> <password>");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let r = admin
        .create_user(
            broker.as_str().into(),
            name.as_str().into(),
            password.as_str().into(),
            "Normal".into(),
        )
        .await;
    admin.shutdown().await;
    match r {
        Ok(()) => {
            println!("compat: created {name}");
            Ok(true)
        }
        Err(e) => {
            println!("compat: create-user failed: {e}");
            Ok(false)
        }
    }
}

/// `admin-topic <broker> <topic> <read> <write> <perm>`: mqadmin's
/// updateTopic (UPDATE_AND_CREATE_TOPIC with its TopicConfig), then what
/// the name server routes (topicRoute), topicStatus (GET_TOPIC_STATS_INFO),
/// brokerStatus (GET_BROKER_RUNTIME_INFO) and deleteTopic (the brokers of
/// the cluster, then the name servers), through the admin client.
async fn admin_topic(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::{MQAdminMutationExt, MQAdminReadExt, MQAdminTopicStatsReadExt};
    let (Some(broker), Some(topic), Some(read), Some(write), Some(perm)) =
        (args.first(), args.get(1), args.get(2), args.get(3), args.get(4))
    else {
        eprintln!("compat: admin-topic <broker> <topic> <read> <write> <perm>");
        return Ok(false);
    };
    let n = |s: &String| s.parse::<u32>().unwrap_or(0);
    let mut admin = admin_client(rt, namesrv).await?;
    let mut config = rocketmq_model::topic::TopicConfig::new(topic.as_str());
    config.read_queue_nums = n(read);
    config.write_queue_nums = n(write);
    config.perm = n(perm);
    let created = admin.upsert_topic_config(broker.as_str().into(), config).await;
    println!(
        "compat: update topic: {}",
        if created.is_ok() {
            "ok".to_string()
        } else {
            format!("{created:?}")
        }
    );
    // The broker registers the change with its name server.
    let mut routed = None;
    for _ in 0..50 {
        let route = admin.examine_topic_route_info(topic.as_str().into()).await;
        if let Ok(Some(r)) = route {
            if let Some(q) = r.queue_datas.first() {
                let got = (q.read_queue_nums, q.write_queue_nums, q.perm);
                routed = Some(got);
                if got == (n(read), n(write), n(perm)) {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match routed {
        Some((r, w, p)) => println!("compat: route read {r} write {w} perm {p}"),
        None => println!("compat: route none"),
    }
    match admin
        .topic_stats_at(broker.as_str().into(), topic.as_str().into())
        .await
    {
        Ok(stats) => println!("compat: topic status queues {}", stats.get_offset_table().len()),
        Err(e) => println!("compat: topic status failed: {e}"),
    }
    match admin.fetch_broker_runtime_stats(broker.as_str().into()).await {
        Ok(kv) => println!(
            "compat: broker status active {}",
            kv.table.get("brokerActive").map(|v| v.to_string()).unwrap_or_default()
        ),
        Err(e) => println!("compat: broker status failed: {e}"),
    }
    let removed = admin.remove_topic(topic.as_str().into(), "DefaultCluster".into()).await;
    println!(
        "compat: delete topic: {}",
        if removed.is_ok() {
            "ok".to_string()
        } else {
            format!("{removed:?}")
        }
    );
    let mut gone = false;
    for _ in 0..50 {
        if matches!(
            admin.examine_topic_route_info(topic.as_str().into()).await,
            Ok(None) | Err(_)
        ) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "compat: route after delete: {}",
        if gone { "none" } else { "still there" }
    );
    admin.shutdown().await;
    Ok(created.is_ok() && removed.is_ok() && gone)
}

/// `admin-groups <broker> <group>`: mqadmin's updateSubGroup
/// (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) for `group` and for the broker's
/// own transaction-check group, the dashboard's consumer list
/// (GET_ALL_SUBSCRIPTIONGROUP_CONFIG) and deleteSubGroup with its offsets
/// (DELETE_SUBSCRIPTIONGROUP), through the admin client.
async fn admin_groups(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::{ConsumerAdmin, MQAdminMutationExt};
    use rocketmq_protocol::protocol::subscription::subscription_group_config::SubscriptionGroupConfig;
    let (Some(broker), Some(group)) = (args.first(), args.get(1)) else {
        eprintln!("compat: admin-groups <broker> <group>");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let upsert = admin
        .upsert_subscription_group(
            broker.as_str().into(),
            SubscriptionGroupConfig::new(group.as_str().into()),
        )
        .await;
    println!("compat: update group: {}", outcome(&upsert));
    let system = admin
        .upsert_subscription_group(
            broker.as_str().into(),
            SubscriptionGroupConfig::new("CID_RMQ_SYS_TRANS".into()),
        )
        .await;
    println!("compat: update system group: {}", outcome(&system));
    let listed = |all: &ClientResult<
        rocketmq_protocol::protocol::body::subscription_group_wrapper::SubscriptionGroupWrapper,
    >| match all {
        Ok(w) => {
            let names: BTreeSet<String> = w.subscription_group_table.keys().map(|k| k.to_string()).collect();
            let system = names
                .iter()
                .filter(|n| n.starts_with("CID_RMQ_SYS_") || n.starts_with('%'))
                .count();
            format!(
                "{} groups, {group} {}, {system} of the broker's own",
                names.len(),
                if names.contains(group.as_str()) {
                    "listed"
                } else {
                    "not listed"
                }
            )
        }
        Err(e) => format!("failed ({e})"),
    };
    let before = admin.get_all_subscription_group(broker.as_str().into(), 5_000).await;
    println!("compat: groups: {}", listed(&before));
    let removed = admin
        .remove_subscription_group(broker.as_str().into(), group.as_str().into(), Some(true))
        .await;
    println!("compat: delete group: {}", outcome(&removed));
    let after = admin.get_all_subscription_group(broker.as_str().into(), 5_000).await;
    println!("compat: groups after delete: {}", listed(&after));
    admin.shutdown().await;
    Ok(upsert.is_ok() && before.is_ok() && removed.is_ok() && after.is_ok())
}

/// `subgroup-honoured <broker> <topic> <group>`: mqadmin updateSubGroup
/// with consumption turned off (and retryMaxTimes 3) through the admin
/// client, read back with examineSubscriptionGroupConfig
/// (GET_SUBSCRIPTIONGROUP_CONFIG); then a push consumer of the group,
/// started while it is off and kept running, and the group turned on
/// again. Prints what was read back and how many of the topic's messages
/// the consumer had while off and once on.
async fn subgroup_honoured(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::{ConsumerAdmin, MQAdminMutationExt};
    use rocketmq_protocol::protocol::subscription::subscription_group_config::SubscriptionGroupConfig;
    const N: usize = 20;
    let (Some(broker), Some(topic), Some(group)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("compat: subgroup-honoured <broker> <topic> <group>");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let mut off = SubscriptionGroupConfig::new(group.as_str().into());
    off.set_consume_enable(false);
    off.set_retry_max_times(3);
    admin.upsert_subscription_group(broker.as_str().into(), off).await?;
    let read = admin
        .examine_subscription_group_config(broker.as_str().into(), group.as_str().into())
        .await?;
    println!(
        "compat: examined: consumeEnable={} retryMaxTimes={}",
        read.consume_enable(),
        read.retry_max_times()
    );
    let p = producer(rt, namesrv, "compat-pg-subgroup", 2).await?;
    send_all(&p, topic, &bodies("subgroup", N)).await?;
    let (mut consumer, got) = member(rt, namesrv, group, topic).await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    println!("compat: consumed while off: {}", lock(&got).len());
    admin
        .upsert_subscription_group(
            broker.as_str().into(),
            SubscriptionGroupConfig::new(group.as_str().into()),
        )
        .await?;
    let all = wait_union(&[&got], N).await;
    println!("compat: consumed once on: {}", all.len());
    consumer.shutdown().await;
    let mut p = p;
    p.shutdown().await;
    admin.shutdown().await;
    Ok(true)
}

/// The admin client (DefaultMQAdminExt), started against `namesrv`; its
/// requests signed with the `COMPAT_ACCESS_KEY` credentials, if any.
async fn admin_client(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<rocketmq_client_rust::DefaultMQAdminExt> {
    let mut admin = match acl_hook() {
        Some(h) => rocketmq_client_rust::DefaultMQAdminExt::with_rpc_hook(Arc::clone(rt), h),
        None => rocketmq_client_rust::DefaultMQAdminExt::new(Arc::clone(rt)),
    };
    admin.set_namesrv_addr(namesrv.to_string());
    admin.start().await?;
    Ok(admin)
}

/// "ok", or why the admin's change was refused.
fn outcome(r: &ClientResult<()>) -> String {
    match r {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("refused ({e})"),
    }
}

/// `subgroup-set-list <broker> <retryMaxTimes> <group>...`: mqadmin
/// updateSubGroupList (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST) of the
/// groups, each with consumption off and that retryMaxTimes, through the
/// admin client; prints the outcome.
async fn subgroup_set_list(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::ConsumerAdmin;
    use rocketmq_protocol::protocol::subscription::subscription_group_config::SubscriptionGroupConfig;
    let (Some(broker), Some(retries)) = (args.first(), args.get(1)) else {
        eprintln!("compat: subgroup-set-list <broker> <retryMaxTimes> <group>...");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let configs = args[2..]
        .iter()
        .map(|g| {
            let mut c = SubscriptionGroupConfig::new(g.as_str().into());
            c.set_consume_enable(false);
            c.set_retry_max_times(retries.parse().unwrap_or(16));
            c
        })
        .collect();
    let r = admin
        .create_and_update_subscription_group_config_list(broker.as_str().into(), configs)
        .await;
    println!("compat: set list: {}", outcome(&r));
    admin.shutdown().await;
    Ok(r.is_ok())
}

/// `subgroup-set <broker> <group> <consumeEnable> <retryMaxTimes> [orderly]`:
/// mqadmin updateSubGroup of those settings through the admin client (the
/// rest Apache's defaults); prints the outcome.
async fn subgroup_set(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::MQAdminMutationExt;
    use rocketmq_protocol::protocol::subscription::subscription_group_config::SubscriptionGroupConfig;
    let (Some(broker), Some(group), Some(enable), Some(retries)) =
        (args.first(), args.get(1), args.get(2), args.get(3))
    else {
        eprintln!("compat: subgroup-set <broker> <group> <consumeEnable> <retryMaxTimes> [orderly]");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let mut config = SubscriptionGroupConfig::new(group.as_str().into());
    config.set_consume_enable(enable == "true");
    config.set_retry_max_times(retries.parse().unwrap_or(16));
    config.set_consume_message_orderly(args.get(4).is_some_and(|o| o == "true"));
    let r = admin.upsert_subscription_group(broker.as_str().into(), config).await;
    println!("compat: set: {}", outcome(&r));
    admin.shutdown().await;
    Ok(r.is_ok())
}

/// `subgroup-delete <broker> <group>`: mqadmin deleteSubGroup
/// (DELETE_SUBSCRIPTIONGROUP, offsets kept) through the admin client;
/// prints the outcome.
async fn subgroup_delete(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::MQAdminMutationExt;
    let (Some(broker), Some(group)) = (args.first(), args.get(1)) else {
        eprintln!("compat: subgroup-delete <broker> <group>");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let r = admin
        .remove_subscription_group(broker.as_str().into(), group.as_str().into(), Some(false))
        .await;
    println!("compat: delete: {}", outcome(&r));
    admin.shutdown().await;
    Ok(r.is_ok())
}

/// `subgroup-get <broker> <group>`: examineSubscriptionGroupConfig
/// (GET_SUBSCRIPTIONGROUP_CONFIG) through the admin client; prints the two
/// settings read back, or that there is none.
async fn subgroup_get(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::ConsumerAdmin;
    let (Some(broker), Some(group)) = (args.first(), args.get(1)) else {
        eprintln!("compat: subgroup-get <broker> <group>");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    match admin
        .examine_subscription_group_config(broker.as_str().into(), group.as_str().into())
        .await
    {
        Ok(c) => println!(
            "compat: config: consumeEnable={} retryMaxTimes={}",
            c.consume_enable(),
            c.retry_max_times()
        ),
        Err(e) => println!("compat: config: none ({e})"),
    }
    admin.shutdown().await;
    Ok(true)
}

/// `broker-info <broker> <group>`: mqadmin getBrokerConfig
/// (GET_BROKER_CONFIG) and queryTopicsByConsumer (QUERY_TOPICS_BY_CONSUMER,
/// through the route of the group's retry topic) through the admin client;
/// prints a few of the broker's properties and the group's topics.
async fn broker_info(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::{BrokerAdmin, TopicAdmin};
    let (Some(broker), Some(group)) = (args.first(), args.get(1)) else {
        eprintln!("compat: broker-info <broker> <group>");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let props = admin.get_broker_config(broker.as_str().into()).await?;
    for key in [
        "brokerName",
        "brokerRole",
        "flushDiskType",
        "messageDelayLevel",
        "listenPort",
    ] {
        let v = props
            .iter()
            .find(|(k, _)| k.as_str() == key)
            .map(|(_, v)| v.to_string());
        println!("compat: config {key}={}", v.unwrap_or_else(|| "<none>".into()));
    }
    let topics = admin.query_topics_by_consumer(group.as_str().into()).await?;
    let mut names: Vec<String> = topics.topic_list.iter().map(|t| t.to_string()).collect();
    names.sort();
    println!("compat: topics of {group}: {}", names.join(","));
    admin.shutdown().await;
    Ok(true)
}

/// `reset-offset <topic> <group> <timestamp ms> <force>`: mqadmin
/// resetOffsetByTime through the admin client (INVOKE_BROKER_TO_RESET_OFFSET
/// to each master of the topic); prints each queue's new offset.
async fn reset_offset(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    use rocketmq_client_rust::OffsetAdmin;
    let (Some(topic), Some(group), Some(ts), Some(force)) = (args.first(), args.get(1), args.get(2), args.get(3))
    else {
        eprintln!("compat: reset-offset <topic> <group> <timestamp ms> <force>");
        return Ok(false);
    };
    let mut admin = admin_client(rt, namesrv).await?;
    let r = admin
        .reset_offset_by_timestamp(
            None,
            topic.as_str().into(),
            group.as_str().into(),
            ts.parse().unwrap_or(0),
            force == "true",
        )
        .await;
    admin.shutdown().await;
    match r {
        Ok(table) => {
            let mut rows: Vec<(i32, u64)> = table.iter().map(|(mq, o)| (mq.queue_id(), *o)).collect();
            rows.sort_unstable();
            for (q, o) in rows {
                println!("compat: reset {q} {o}");
            }
            Ok(true)
        }
        Err(e) => {
            println!("compat: reset-offset failed: {e}");
            Ok(false)
        }
    }
}

/// `COMPAT_FAULT` (unset in the suite), see above.
fn fault() -> Option<String> {
    std::env::var("COMPAT_FAULT").ok().filter(|f| !f.is_empty())
}

static DROPPED: AtomicBool = AtomicBool::new(false);

/// Records one delivery (through `COMPAT_FAULT`, if set).
fn record<T: Clone>(into: &mut Vec<T>, item: T) {
    match fault().as_deref() {
        Some("duplicate") => {
            into.push(item.clone());
            into.push(item);
        }
        Some("drop") if !DROPPED.swap(true, Ordering::SeqCst) => {}
        _ => into.push(item),
    }
}

fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s.into_owned()
    }
}

/// Whether `got` holds every body of `want` exactly once and nothing else;
/// prints the tally and what is missing, duplicated or unexpected.
fn exactly_once(label: &str, want: &[Vec<u8>], got: &[Vec<u8>]) -> bool {
    let wanted: BTreeSet<&[u8]> = want.iter().map(Vec::as_slice).collect();
    let mut n: BTreeMap<&[u8], usize> = BTreeMap::new();
    for g in got {
        *n.entry(g.as_slice()).or_default() += 1;
    }
    let missing: Vec<String> = wanted.iter().filter(|w| !n.contains_key(*w)).map(|w| show(w)).collect();
    let twice: Vec<String> = n
        .iter()
        .filter(|(b, k)| wanted.contains(*b) && **k > 1)
        .map(|(b, k)| format!("{} x{k}", show(b)))
        .collect();
    let unexpected: Vec<String> = n
        .iter()
        .filter(|(b, _)| !wanted.contains(*b))
        .map(|(b, k)| format!("{} x{k}", show(b)))
        .collect();
    println!(
        "compat: {label}: {} deliveries of {} messages: {} missing, {} delivered more than once, {} unexpected",
        got.len(),
        wanted.len(),
        missing.len(),
        twice.len(),
        unexpected.len()
    );
    for (what, list) in [
        ("missing", &missing),
        ("more than once", &twice),
        ("unexpected", &unexpected),
    ] {
        if !list.is_empty() {
            println!(
                "compat: {label}: {what}: {:?}{}",
                &list[..list.len().min(10)],
                if list.len() > 10 { " …" } else { "" }
            );
        }
    }
    wanted.len() == want.len() && missing.is_empty() && twice.is_empty() && unexpected.is_empty()
}

/// After the last wanted delivery, how long a consumer keeps running so that
/// a duplicate or an unwanted message would show up.
const SETTLE: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> ClientResult<()> {
    // rustls is built with two crypto providers here (the client's
    // dependencies ask for both): a TLS connection needs the process
    // default chosen, or the client cannot build its TLS config.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let namesrv = args.get(1).cloned().unwrap_or_else(|| "127.0.0.1:9876".into());
    let scenario = args.get(2).cloned().unwrap_or_else(|| "send-consume".into());
    // The listener runs on the client's metadata-io blocking lane, by default
    // 2 × cores wide with an 8 × cores queue: fewer than the 20 consume tasks
    // a push consumer starts, and a task that finds the lane full fails
    // ("runtime.capacity.exhausted"; a broadcasting consumer then drops the
    // message). Widen it.
    let mut runtime_config = RuntimeConfig {
        thread_name: "rokka-compat".into(),
        max_blocking_threads: 160,
        ..Default::default()
    };
    for lane in [
        &mut runtime_config.blocking_lane_policies.metadata_io,
        &mut runtime_config.blocking_lane_policies.storage_io,
    ] {
        lane.max_concurrency = 64;
        lane.max_queue_depth = 8192;
    }
    let owner = RuntimeOwner::plan(runtime_config)
        .map_err(|e| ClientError::internal("plan runtime", e))?
        .build()
        .map_err(|e| ClientError::internal("build runtime", e))?;
    let telemetry =
        rocketmq_observability::install_global(&rocketmq_observability::TelemetryBootstrapConfig::default())
            .map_err(|e| ClientError::internal("telemetry", e))?;
    let rt = ClientRuntime::try_new(
        owner.root_context().component("client"),
        ClientRuntimeConfig::default(),
        telemetry.handle(),
    )?;
    let ok = match scenario.as_str() {
        "send-consume" => send_consume(&rt, &namesrv).await?,
        "tag-filter" => tag_filter(&rt, &namesrv).await?,
        "send-kinds" => send_kinds(&rt, &namesrv).await?,
        "ordered" => ordered(&rt, &namesrv).await?,
        "group" => group(&rt, &namesrv).await?,
        "lite-pull" => lite_pull(&rt, &namesrv).await?,
        "resume-1" => resume(&rt, &namesrv, 1).await?,
        "resume-2" => resume(&rt, &namesrv, 2).await?,
        "broadcast" => broadcast(&rt, &namesrv).await?,
        "delay" => delay(&rt, &namesrv).await?,
        "timer" => timer(&rt, &namesrv).await?,
        "query" => query(&rt, &namesrv).await?,
        "request-reply" => request_reply(&rt, &namesrv).await?,
        "orderly-group" => orderly_group(&rt, &namesrv).await?,
        "transactions" => transactions(&rt, &namesrv).await?,
        "tx-restart-1" => tx_restart(&rt, &namesrv, 1).await?,
        "tx-restart-2" => tx_restart(&rt, &namesrv, 2).await?,
        "delay-restart-1" => delay_restart(&rt, &namesrv, 1).await?,
        "delay-restart-2" => delay_restart(&rt, &namesrv, 2).await?,
        "retry-dlq" => retry_dlq(&rt, &namesrv).await?,
        "dying-member" => dying_member(&rt, &namesrv, &args[3..]).await?,
        "takeover" => takeover(&rt, &namesrv, &args[3..]).await?,
        "cross-produce" => cross_produce(&rt, &namesrv, &args[3..]).await?,
        "cross-consume" => cross_consume(&rt, &namesrv, &args[3..]).await?,
        "cross-member" => cross_member(&rt, &namesrv, &args[3..]).await?,
        "create-user" => create_user(&rt, &namesrv, &args[3..]).await?,
        "reset-offset" => reset_offset(&rt, &namesrv, &args[3..]).await?,
        "admin-topic" => admin_topic(&rt, &namesrv, &args[3..]).await?,
        "admin-groups" => admin_groups(&rt, &namesrv, &args[3..]).await?,
        "subgroup-honoured" => subgroup_honoured(&rt, &namesrv, &args[3..]).await?,
        "subgroup-set" => subgroup_set(&rt, &namesrv, &args[3..]).await?,
        "subgroup-get" => subgroup_get(&rt, &namesrv, &args[3..]).await?,
        "subgroup-delete" => subgroup_delete(&rt, &namesrv, &args[3..]).await?,
        "subgroup-set-list" => subgroup_set_list(&rt, &namesrv, &args[3..]).await?,
        "broker-info" => broker_info(&rt, &namesrv, &args[3..]).await?,
        "dur-send" => durability::send(&rt, &namesrv, &args[3..]).await?,
        "dur-delayed" => durability::delayed(&rt, &namesrv, &args[3..]).await?,
        "dur-consume" => durability::consume(&rt, &namesrv, &args[3..]).await?,
        "dur-tx" => durability::tx(&rt, &namesrv, &args[3..]).await?,
        "bench" => {
            let scale = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1.0);
            bench(&rt, &namesrv, scale, args.get(4).map_or("all", String::as_str)).await?
        }
        other => {
            eprintln!("compat: unknown scenario {other}");
            false
        }
    };
    let _ = rt.shutdown().await;
    println!("compat: RESULT {scenario} {}", if ok { "ok" } else { "FAILED" });
    std::process::exit(if ok { 0 } else { 1 });
}

async fn send_consume(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const N: usize = 200;
    let topic = "CompatSendConsume";
    let mut producer = DefaultMQProducer::builder(Arc::clone(rt))
        .client_config(client_config())
        .producer_group("compat-pg".to_string())
        .name_server_addr(namesrv.to_string())
        .build();
    producer.start().await?;
    let mut sent = Vec::new();
    for i in 0..N {
        let body = format!("compat-{i}-{}", "x".repeat(i % 50)).into_bytes();
        let msg = Message::builder()
            .topic(topic)
            .tags(if i % 2 == 0 { "TagA" } else { "TagB" })
            .body_slice(&body)
            .build_unchecked();
        producer.send_with_timeout(msg, 5000).await?;
        sent.push(body);
    }
    producer.shutdown().await;
    println!("compat: sent {N}");
    let got = consume_all(rt, namesrv, "compat-cg", topic, "*", N).await?;
    Ok(exactly_once("send-consume", &sent, &got))
}

async fn tag_filter(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const N: usize = 150;
    let topic = "CompatTagFilter";
    let mut producer = DefaultMQProducer::builder(Arc::clone(rt))
        .producer_group("compat-pg-tags".to_string())
        .name_server_addr(namesrv.to_string())
        .build();
    producer.start().await?;
    let mut wanted = Vec::new();
    for i in 0..N {
        let tag = ["TagA", "TagB", "TagC"][i % 3];
        let body = format!("{tag}-{i}").into_bytes();
        let msg = Message::builder()
            .topic(topic)
            .tags(tag)
            .body_slice(&body)
            .build_unchecked();
        producer.send_with_timeout(msg, 5000).await?;
        if tag != "TagC" {
            wanted.push(body);
        }
    }
    producer.shutdown().await;
    // (consume_all keeps consuming for SETTLE after the last wanted one: a
    // TagC delivery would show up then.)
    let got = consume_all(rt, namesrv, "compat-cg-tags", topic, "TagA || TagB", wanted.len()).await?;
    Ok(exactly_once("tag filter (TagA || TagB)", &wanted, &got))
}

/// A push consumer from the first offset with `expr`, until `want` distinct
/// bodies arrived (or 60 s passed), then SETTLE more: every delivery, in
/// arrival order.
async fn consume_all(
    rt: &Arc<ClientRuntime>,
    namesrv: &str,
    group: &str,
    topic: &str,
    expr: &str,
    want: usize,
) -> ClientResult<Vec<Vec<u8>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut consumer = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .client_config(client_config())
        .consumer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    consumer.subscribe(topic, expr).await?;
    consumer.register_message_listener_concurrently(Record(Arc::clone(&seen), false));
    consumer.start().await?;
    wait_union(&[&seen], want).await;
    tokio::time::sleep(SETTLE).await;
    consumer.shutdown().await;
    let got = lock(&seen).clone();
    Ok(got)
}

async fn send_kinds(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    let topic = "CompatSendKinds";
    let mut producer = DefaultMQProducer::builder(Arc::clone(rt))
        .producer_group("compat-pg-kinds".to_string())
        .name_server_addr(namesrv.to_string())
        .build();
    producer.start().await?;
    let msg = |kind: &str, i: usize| {
        let body = format!("{kind}-{i}").into_bytes();
        (
            Message::builder()
                .topic(topic)
                .tags(kind)
                .body_slice(&body)
                .build_unchecked(),
            body,
        )
    };
    let mut sent = Vec::new();
    for i in 0..50 {
        let (m, b) = msg("sync", i);
        producer.send_with_timeout(m, 5000).await?;
        sent.push(b);
    }
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for i in 0..50 {
        let (m, b) = msg("async", i);
        let a = Arc::clone(&acked);
        producer
            .send_with_callback(
                m,
                move |r: Option<&rocketmq_client_rust::SendResult>, e: Option<&ClientError>| {
                    if r.is_some() && e.is_none() {
                        a.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                },
            )
            .await?;
        sent.push(b);
    }
    for i in 0..50 {
        let (m, b) = msg("oneway", i);
        producer.send_oneway(m).await?;
        sent.push(b);
    }
    for batch in 0..5 {
        let mut msgs = Vec::new();
        for j in 0..10 {
            let (m, b) = msg("batch", batch * 10 + j);
            msgs.push(m);
            sent.push(b);
        }
        producer.send_batch(msgs).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.load(std::sync::atomic::Ordering::Relaxed) < 50 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let async_ok = acked.load(std::sync::atomic::Ordering::Relaxed);
    producer.shutdown().await;
    let got = consume_all(rt, namesrv, "compat-cg-kinds", topic, "*", sent.len()).await?;
    println!("compat: send kinds: async callbacks {async_ok}/50");
    Ok(exactly_once("send kinds", &sent, &got) && async_ok == 50)
}

async fn producer(rt: &Arc<ClientRuntime>, namesrv: &str, group: &str, queues: u32) -> ClientResult<DefaultMQProducer> {
    let mut b = DefaultMQProducer::builder(Arc::clone(rt))
        .producer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .default_topic_queue_nums(queues);
    if let Some(h) = acl_hook() {
        b = b.rpc_hook(h);
    }
    let mut p = b.build();
    p.start().await?;
    Ok(p)
}

/// Sends `bodies` to `topic` synchronously.
async fn send_all(p: &DefaultMQProducer, topic: &str, bodies: &[Vec<u8>]) -> ClientResult<()> {
    for b in bodies {
        let msg = Message::builder()
            .topic(topic)
            .tags("T")
            .body_slice(b)
            .build_unchecked();
        p.send_with_timeout(msg, 5000).await?;
    }
    Ok(())
}

fn bodies(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{prefix}-{i}").into_bytes()).collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What an orderly listener saw: (queue id, body, keys, `seq` property).
type Seen = Arc<Mutex<Vec<(i32, Vec<u8>, Option<Vec<String>>, Option<String>)>>>;

struct Orderly(Seen);

impl MessageListenerOrderly for Orderly {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _ctx: &mut ConsumeOrderlyContext,
    ) -> ClientResult<ConsumeOrderlyStatus> {
        let mut g = lock(&self.0);
        for m in msgs {
            record(
                &mut g,
                (
                    m.queue_id(),
                    m.body().map(|b| b.to_vec()).unwrap_or_default(),
                    m.keys(),
                    m.property("seq").map(String::from),
                ),
            );
        }
        Ok(ConsumeOrderlyStatus::Success)
    }
}

async fn ordered(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const ORDERS: u64 = 4;
    const PER: usize = 40;
    let topic = "CompatOrdered";
    let p = producer(rt, namesrv, "compat-pg-ordered", 4).await?;
    let mut queue_of: std::collections::BTreeMap<u64, BTreeSet<i32>> = Default::default();
    for seq in 0..PER {
        for id in 0..ORDERS {
            let body = format!("order-{id}-seq-{seq:03}");
            let msg = Message::builder()
                .topic(topic)
                .tags("Ord")
                .key(format!("order-{id}"))
                .raw_property("seq", seq.to_string())?
                .body_slice(body.as_bytes())
                .build_unchecked();
            let r = p
                .send_with_selector_timeout(
                    msg,
                    |mqs: &[MessageQueue], _m: &Message, id: &u64| {
                        (!mqs.is_empty()).then(|| mqs[(*id as usize) % mqs.len()].clone())
                    },
                    id,
                    5000,
                )
                .await?;
            let q = r.and_then(|r| r.message_queue).map_or(-1, |mq| mq.queue_id());
            queue_of.entry(id).or_default().insert(q);
        }
    }
    let mut p = p;
    p.shutdown().await;
    let one_queue_each = queue_of.values().all(|qs| qs.len() == 1 && !qs.contains(&-1));
    let distinct: BTreeSet<i32> = queue_of.values().flatten().copied().collect();
    println!("compat: ordered: queues per order {queue_of:?}");

    let seen: Seen = Arc::default();
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group("compat-cg-ordered".to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_orderly(Orderly(Arc::clone(&seen)));
    c.start().await?;
    let want = ORDERS as usize * PER;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && lock(&seen).len() < want {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.shutdown().await;
    let seen = lock(&seen).clone();
    let mut ok = one_queue_each && distinct.len() == ORDERS as usize && seen.len() == want;
    for id in 0..ORDERS {
        let prefix = format!("order-{id}-");
        let mine: Vec<_> = seen.iter().filter(|s| s.1.starts_with(prefix.as_bytes())).collect();
        let in_order = mine.iter().enumerate().all(|(seq, (q, body, keys, prop))| {
            *body == format!("order-{id}-seq-{seq:03}").into_bytes()
                && queue_of.get(&id).is_some_and(|qs| qs.contains(q))
                && keys.as_deref() == Some(&[format!("order-{id}")][..])
                && prop.as_deref() == Some(seq.to_string().as_str())
        });
        if !in_order || mine.len() != PER {
            println!(
                "compat: ordered: order {id}: {} messages, in order: {in_order}",
                mine.len()
            );
            ok = false;
        }
    }
    println!("compat: ordered: consumed {} of {want}", seen.len());
    Ok(ok)
}

/// A clustering push consumer recording every body it consumes (duplicates kept).
async fn member(
    rt: &Arc<ClientRuntime>,
    namesrv: &str,
    group: &str,
    topic: &str,
) -> ClientResult<(DefaultMQPushConsumer, Arc<Mutex<Vec<Vec<u8>>>>)> {
    member_with(rt, namesrv, group, topic, false).await
}

/// [`member`]; `stream`: each message consumed is printed at once
/// (`compat: got <hex>`), so what a member killed -9 had is known.
async fn member_with(
    rt: &Arc<ClientRuntime>,
    namesrv: &str,
    group: &str,
    topic: &str,
    stream: bool,
) -> ClientResult<(DefaultMQPushConsumer, Arc<Mutex<Vec<Vec<u8>>>>)> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = ClientConfig::default();
    cfg.set_persist_consumer_offset_interval(1000);
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .client_config(cfg)
        .consumer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .await_termination_millis_when_shutdown(5000)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_concurrently(Record(Arc::clone(&got), stream));
    c.start().await?;
    Ok((c, got))
}

/// Records each body consumed; with `.1`, prints it too.
struct Record(Arc<Mutex<Vec<Vec<u8>>>>, bool);

impl MessageListenerConcurrently for Record {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let mut g = lock(&self.0);
        for m in msgs {
            let before = g.len();
            record(&mut g, m.body().map(|b| b.to_vec()).unwrap_or_default());
            // Streamed: each body printed as recorded (an injected fault
            // included), so what a member killed -9 had is known.
            if self.1 {
                for b in &g[before..] {
                    println!("compat: got {}", hexs(b));
                }
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

/// Waits until the members together hold `want` distinct bodies (60 s at most).
async fn wait_union(members: &[&Arc<Mutex<Vec<Vec<u8>>>>], want: usize) -> BTreeSet<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all: BTreeSet<Vec<u8>> = members.iter().flat_map(|m| lock(m).clone()).collect();
        if all.len() >= want || Instant::now() >= deadline {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn group(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const N: usize = 120;
    let topic = "CompatGroup";
    let g = "compat-cg-group";
    let mut p = producer(rt, namesrv, "compat-pg-group", 6).await?;
    let b1 = bodies("first", N);
    send_all(&p, topic, &b1).await?;
    let started = Instant::now();
    let (a, ga) = member(rt, namesrv, g, topic).await?;
    let (b, gb) = member(rt, namesrv, g, topic).await?;
    let all = wait_union(&[&ga, &gb], N).await;
    let (a1, b1n) = (lock(&ga).len(), lock(&gb).len());
    println!(
        "compat: group phase 1 (two members): a {a1}, b {b1n}, distinct {}",
        all.len()
    );
    let mut ok = all.len() == N && a1 > 0 && b1n > 0;

    // Offsets reach the broker from the first persist run (10 s after start) on.
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(started.elapsed())).await;
    let (c, gc) = member(rt, namesrv, g, topic).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = [lock(&ga).len(), lock(&gb).len(), lock(&gc).len()];
    send_all(&p, topic, &bodies("second", N)).await?;
    let all = wait_union(&[&ga, &gb, &gc], 2 * N).await;
    let phase2 = [
        lock(&ga).len() - before[0],
        lock(&gb).len() - before[1],
        lock(&gc).len() - before[2],
    ];
    println!(
        "compat: group phase 2 (three members): {phase2:?}, distinct {}",
        all.len()
    );
    ok &= all.len() == 2 * N && phase2.iter().all(|n| *n > 0);

    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut a = a;
    a.shutdown().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = [lock(&gb).len(), lock(&gc).len()];
    send_all(&p, topic, &bodies("third", N)).await?;
    p.shutdown().await;
    let all = wait_union(&[&ga, &gb, &gc], 3 * N).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let phase3 = [lock(&gb).len() - before[0], lock(&gc).len() - before[1]];
    println!(
        "compat: group phase 3 (a left): b and c {phase3:?}, distinct {}",
        all.len()
    );
    ok &= all.len() == 3 * N && phase3.iter().sum::<usize>() == N;
    let total = lock(&ga).len() + lock(&gb).len() + lock(&gc).len();
    println!("compat: group: {total} deliveries of {} messages", 3 * N);
    ok &= total == 3 * N;
    let (mut b, mut c) = (b, c);
    b.shutdown().await;
    c.shutdown().await;
    Ok(ok)
}

async fn lite_pull(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const N: usize = 300;
    let topic = "CompatLitePull";
    let mut p = producer(rt, namesrv, "compat-pg-lite", 4).await?;
    let first = bodies("lite", N);
    for chunk in first.chunks(50) {
        let msgs: Vec<Message> = chunk
            .iter()
            .map(|b| {
                Message::builder()
                    .topic(topic)
                    .tags("L")
                    .body_slice(b)
                    .build_unchecked()
            })
            .collect();
        p.send_batch(msgs).await?;
    }
    let poll_until = |c: &DefaultLitePullConsumer, want: usize, extra: Duration| {
        let c = c.clone();
        async move {
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while got.len() < want && Instant::now() < deadline {
                for m in c.poll_with_timeout(1000).await {
                    got.push(m.body().map(|b| b.to_vec()).unwrap_or_default());
                }
            }
            let deadline = Instant::now() + extra;
            while Instant::now() < deadline {
                for m in c.poll_with_timeout(500).await {
                    got.push(m.body().map(|b| b.to_vec()).unwrap_or_default());
                }
            }
            got
        }
    };
    let lite = |_: ()| {
        DefaultLitePullConsumer::builder(Arc::clone(rt))
            .consumer_group("compat-lite")
            .name_server_addr(namesrv.to_string())
            .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
            .pull_batch_size(32)
            .auto_commit(false)
            .build()
    };
    let c1 = lite(())?;
    c1.subscribe_with_expression(topic, "*").await?;
    c1.start().await?;
    let got = poll_until(&c1, N, Duration::from_secs(1)).await;
    c1.commit_all().await?;
    c1.shutdown().await;
    let distinct: BTreeSet<Vec<u8>> = got.iter().cloned().collect();
    let want: BTreeSet<Vec<u8>> = first.iter().cloned().collect();
    println!(
        "compat: lite pull: {} polled, {} distinct of {N}",
        got.len(),
        distinct.len()
    );
    let mut ok = got.len() == N && distinct == want;

    let later = bodies("later", 20);
    send_all(&p, topic, &later).await?;
    p.shutdown().await;
    let c2 = lite(())?;
    c2.subscribe_with_expression(topic, "*").await?;
    c2.start().await?;
    let got = poll_until(&c2, later.len(), Duration::from_secs(2)).await;
    c2.shutdown().await;
    println!(
        "compat: lite pull after commit: {} polled (want the 20 new ones only)",
        got.len()
    );
    ok &= got.iter().cloned().collect::<BTreeSet<_>>() == later.iter().cloned().collect() && got.len() == later.len();
    Ok(ok)
}

/// Phase 1 consumes 100 messages and shuts down (offsets persisted); rokka
/// restarts; phase 2 sends 50 more and must get exactly those.
async fn resume(rt: &Arc<ClientRuntime>, namesrv: &str, phase: u32) -> ClientResult<bool> {
    let topic = "CompatResume";
    let g = "compat-cg-resume";
    let mut p = producer(rt, namesrv, "compat-pg-resume", 4).await?;
    let sent = bodies(
        if phase == 1 { "before" } else { "after" },
        if phase == 1 { 100 } else { 50 },
    );
    send_all(&p, topic, &sent).await?;
    p.shutdown().await;
    let (mut c, got) = member(rt, namesrv, g, topic).await?;
    let all = wait_union(&[&got], sent.len()).await;
    // Long enough for strays (old messages would show up now) and for the
    // first offset persist run.
    tokio::time::sleep(Duration::from_secs(if phase == 1 { 11 } else { 3 })).await;
    c.shutdown().await;
    let got = lock(&got).clone();
    let want: BTreeSet<Vec<u8>> = sent.into_iter().collect();
    println!(
        "compat: resume phase {phase}: {} deliveries, {} distinct",
        got.len(),
        all.len()
    );
    Ok(got.len() == want.len() && got.into_iter().collect::<BTreeSet<_>>() == want)
}

async fn broadcast(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const N: usize = 100;
    let topic = "CompatBroadcast";
    let mut p = producer(rt, namesrv, "compat-pg-bc", 4).await?;
    let sent = bodies("bc", N);
    send_all(&p, topic, &sent).await?;
    p.shutdown().await;
    let mut consumers = Vec::new();
    for name in ["bc-1", "bc-2"] {
        let got = Arc::new(Mutex::new(Vec::new()));
        let mut cfg = ClientConfig::default();
        cfg.set_instance_name(name.into());
        let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
            .client_config(cfg)
            .consumer_group("compat-cg-bc".to_string())
            .name_server_addr(namesrv.to_string())
            .message_model(MessageModel::Broadcasting)
            .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
            .build();
        c.subscribe(topic, "*").await?;
        c.register_message_listener_concurrently(Record(Arc::clone(&got), false));
        c.start().await?;
        consumers.push((c, got));
    }
    for (_, got) in &consumers {
        wait_union(&[got], N).await;
    }
    tokio::time::sleep(SETTLE).await;
    let mut ok = true;
    for (i, (mut c, got)) in consumers.into_iter().enumerate() {
        c.shutdown().await;
        ok &= exactly_once(&format!("broadcast consumer {}", i + 1), &sent, &lock(&got));
    }
    Ok(ok)
}

fn rate(label: &str, n: usize, bytes: usize, t: Duration) {
    let secs = t.as_secs_f64().max(1e-9);
    println!(
        "compat: bench {label}: {n} msgs in {secs:.2} s = {:.0} msg/s, {:.1} MB/s",
        n as f64 / secs,
        (n * bytes) as f64 / secs / 1e6
    );
}

/// CPU time (user + system, seconds) of a process so far, from
/// `/proc/<pid>/stat` (fields 14 and 15, in clock ticks: USER_HZ, which
/// is 100 on Linux whatever the kernel's own tick).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from its ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The CPU the client (this process) and rokka (`BENCH_ROKKA_PID`, when
/// given) spent on a stage, printed per message so the broker's own share
/// of a send is visible next to the client's on the shared cores.
struct StageCpu {
    client: Option<f64>,
    rokka: Option<f64>,
}

impl StageCpu {
    fn start() -> Self {
        StageCpu {
            client: cpu_seconds("self"),
            rokka: rokka_pid().and_then(|p| cpu_seconds(&p)),
        }
    }

    fn report(&self, n: usize) {
        let per = |before: Option<f64>, now: Option<f64>| match (before, now) {
            (Some(b), Some(a)) => format!("{:.2} µs", (a - b) * 1e6 / n.max(1) as f64),
            _ => "-".to_string(),
        };
        println!(
            "compat: bench   CPU per message: client {}, rokka {}",
            per(self.client, cpu_seconds("self")),
            per(self.rokka, rokka_pid().and_then(|p| cpu_seconds(&p)))
        );
    }
}

fn rokka_pid() -> Option<String> {
    std::env::var("BENCH_ROKKA_PID").ok().filter(|p| !p.is_empty())
}

/// Sends `n` messages of `size` bytes from `tasks` concurrent tasks over one
/// producer; `kind` is sync, oneway or batch (64 per batch).
async fn bench_send(
    p: &Arc<DefaultMQProducer>,
    topic: &str,
    kind: &str,
    size: usize,
    n: usize,
    tasks: usize,
) -> ClientResult<()> {
    let body = vec![b'x'; size];
    let cpu = StageCpu::start();
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let p = Arc::clone(p);
        let (body, topic, kind) = (body.clone(), topic.to_string(), kind.to_string());
        handles.push(tokio::spawn(async move {
            let per = n / tasks;
            let mut sent = 0;
            let mut lat = Vec::new();
            while sent < per {
                let m = || {
                    Message::builder()
                        .topic(topic.as_str())
                        .body_slice(&body)
                        .build_unchecked()
                };
                match kind.as_str() {
                    "batch" => {
                        let k = 64.min(per - sent);
                        p.send_batch((0..k).map(|_| m()).collect::<Vec<_>>()).await?;
                        sent += k;
                    }
                    "oneway" => {
                        p.send_oneway(m()).await?;
                        sent += 1;
                    }
                    _ => {
                        let t = Instant::now();
                        p.send_with_timeout(m(), 10_000).await?;
                        lat.push(t.elapsed());
                        sent += 1;
                    }
                }
            }
            ClientResult::Ok(lat)
        }));
    }
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await.map_err(|e| ClientError::internal("bench task", e))??);
    }
    rate(
        &format!("{kind} send {size} B x{tasks}"),
        n / tasks * tasks,
        size,
        started.elapsed(),
    );
    if kind == "oneway" {
        // Oneway sends are done when written: let rokka read what is still
        // in the socket buffers before its CPU is read, so that it counts
        // to this stage and not to the next.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cpu.report(n / tasks * tasks);
    if !lat.is_empty() {
        lat.sort_unstable();
        let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize].as_micros();
        println!(
            "compat: bench   latency µs: p50 {} p99 {} p99.9 {} max {}",
            q(0.5),
            q(0.99),
            q(0.999),
            q(1.0)
        );
    }
    Ok(())
}

/// The bench: sends of each kind, then push and lite-pull consumption of the
/// batch topic. `scale` multiplies every message count.
async fn bench(rt: &Arc<ClientRuntime>, namesrv: &str, scale: f64, stages: &str) -> ClientResult<bool> {
    let on = |s: &str| stages == "all" || stages.split(',').any(|x| x == s);
    let n = |base: usize| ((base as f64 * scale) as usize).max(64);
    let mut p = DefaultMQProducer::builder(Arc::clone(rt))
        .producer_group("bench-pg".to_string())
        .name_server_addr(namesrv.to_string())
        .default_topic_queue_nums(8)
        .build();
    p.start().await?;
    let p = Arc::new(p);
    if on("sync") {
        bench_send(&p, "BenchSync100", "sync", 100, n(60_000), 8).await?;
        bench_send(&p, "BenchSync1k", "sync", 1024, n(60_000), 8).await?;
        bench_send(&p, "BenchSync100", "sync", 100, n(30_000), 1).await?;
    }
    let batch_n = n(640_000);
    bench_send(&p, "BenchBatch", "batch", 100, batch_n, 4).await?;
    if on("oneway") {
        // 4 sending tasks, 16 and 64: the client's own cost per oneway
        // send falls with more of them in flight on its connection.
        for tasks in [4, 16, 64] {
            bench_send(&p, "BenchOneway", "oneway", 100, n(300_000), tasks).await?;
        }
    }
    if !on("consume") {
        return Ok(true);
    }

    let got = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group("bench-push".to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .consume_message_batch_max_size(32)
        .build();
    c.subscribe("BenchBatch", "*").await?;
    c.register_message_listener_concurrently(Count(Arc::clone(&got)));
    c.start().await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while lock(&got).len() < batch_n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pushed = lock(&got).len();
    rate("push consume 100 B", pushed, 100, started.elapsed());
    c.shutdown().await;

    let started = Instant::now();
    let lite = DefaultLitePullConsumer::builder(Arc::clone(rt))
        .consumer_group("bench-lite")
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .pull_batch_size(256)
        .build()?;
    lite.subscribe_with_expression("BenchBatch", "*").await?;
    lite.start().await?;
    let mut pulled = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while pulled < batch_n && Instant::now() < deadline {
        pulled += lite.poll_with_timeout_zero_copy(1000).await.len();
    }
    rate("lite-pull consume 100 B", pulled, 100, started.elapsed());
    lite.shutdown().await;
    Ok(pushed >= batch_n && pulled >= batch_n)
}

struct Count(Arc<Mutex<Vec<()>>>);

impl MessageListenerConcurrently for Count {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        lock(&self.0).extend(msgs.iter().map(|_| ()));
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

fn hexs(b: &[u8]) -> String {
    if b.is_empty() {
        return "-".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `cross-produce <topic> <n> [pad]`: sync sends with keys, tags and user
/// properties, for a Kafka consumer to check (compat-tests/cross).
async fn cross_produce(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("Cross", String::as_str);
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    // Optional: bodies padded to this many bytes — over 4 KiB the client
    // compresses them (zlib, the COMPRESSED flag), as every RocketMQ
    // producer does by default.
    let pad: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut p = producer(rt, namesrv, "cross-pg", 4).await?;
    for i in 0..n {
        let mut body = format!("rmq-{i}-é").into_bytes();
        while body.len() < pad {
            body.extend_from_slice(format!(" {i}:{}", body.len()).as_bytes());
        }
        let msg = Message::builder()
            .topic(topic)
            .tags(if i % 2 == 0 { "TagX" } else { "TagY" })
            .key(format!("key-{i}"))
            .raw_property("p1", format!("v{i}"))?
            .raw_property("unicode", format!("é{i}"))?
            .body_slice(&body)
            .build_unchecked();
        p.send_with_timeout(msg, 5000).await?;
    }
    p.shutdown().await;
    println!("compat: sent {n}");
    Ok(true)
}

/// `cross-consume <topic> <group> <n> [expr]`: a clustering push consumer
/// from the first offset until n messages arrived (then 3 s more, so extra
/// deliveries show); prints one `compat: msg` line per delivery:
/// queue offset born body keys tags properties (byte fields in hex, `-` if
/// empty) store-host (the broker that stored it), then shuts down
/// (committing its offsets).
async fn cross_consume(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("Cross", String::as_str);
    let group = args.get(1).map_or("cross-cg", String::as_str);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let expr = args.get(3).map_or("*", String::as_str);
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    struct Lines(Arc<Mutex<Vec<String>>>);
    impl MessageListenerConcurrently for Lines {
        fn consume_message(
            &self,
            msgs: &[&MessageExt],
            _c: &ConsumeConcurrentlyContext,
        ) -> ClientResult<ConsumeConcurrentlyStatus> {
            let mut g = lock(&self.0);
            for m in msgs {
                let mut props: Vec<(String, String)> = m
                    .properties()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                props.sort();
                let mut p = Vec::new();
                for (k, v) in props {
                    p.extend_from_slice(k.as_bytes());
                    p.push(1);
                    p.extend_from_slice(v.as_bytes());
                    p.push(2);
                }
                g.push(format!(
                    "{} {} {} {} {} {} {} {}",
                    m.queue_id(),
                    m.queue_offset(),
                    m.born_timestamp(),
                    hexs(&m.body().map(|b| b.to_vec()).unwrap_or_default()),
                    hexs(m.property("KEYS").unwrap_or_default().as_bytes()),
                    hexs(m.property("TAGS").unwrap_or_default().as_bytes()),
                    hexs(&p),
                    m.store_host(),
                ));
            }
            Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
        }
    }
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .await_termination_millis_when_shutdown(5000)
        .rpc_hook(acl_hook().map(|h| h as Arc<_>))
        .build();
    c.subscribe(topic, expr).await?;
    c.register_message_listener_concurrently(Lines(Arc::clone(&seen)));
    c.start().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && lock(&seen).len() < n {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.shutdown().await;
    let lines = lock(&seen).clone();
    for l in &lines {
        println!("compat: msg {l}");
    }
    println!("compat: consumed {} (wanted {n})", lines.len());
    Ok(lines.len() >= n)
}

/// `cross-member <topic> <group> <seconds> [stdin]`: a clustering push
/// consumer (offsets persisted every second) that runs for `seconds` — or,
/// with `stdin`, until its standard input ends, if sooner (a test closes it
/// once it has what it waited for) — then shuts down cleanly. Every body
/// it consumes is printed as it is consumed (`compat: got <hex>`).
async fn cross_member(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("Cross", String::as_str);
    let group = args.get(1).map_or("cross-cg", String::as_str);
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let until_stdin_ends = args.get(3).is_some_and(|a| a == "stdin");
    // What it consumes is printed as it goes (a member killed -9 too).
    let (mut c, got) = member_with(rt, namesrv, group, topic, true).await?;
    let stdin_ended = async {
        if !until_stdin_ends {
            return std::future::pending().await;
        }
        use tokio::io::AsyncReadExt;
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 256];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(secs)) => {}
        _ = stdin_ended => {}
    }
    c.shutdown().await;
    println!("compat: member consumed {}", lock(&got).len());
    Ok(true)
}

/// `delay`: messages sent with delay levels 1, 2 and 3 (1 s, 5 s, 10 s)
/// arrive that long after they were sent, within ±1 s.
async fn delay(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    let topic = "CompatDelay";
    let mut p = producer(rt, namesrv, "compat-pg-delay", 4).await?;
    // The topic exists before the consumer subscribes.
    send_all(&p, topic, &[b"warm-up".to_vec()]).await?;
    let arrivals: Arc<Mutex<Vec<(Vec<u8>, Instant)>>> = Arc::default();
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group("compat-cg-delay".to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_concurrently(Arrive(Arc::clone(&arrivals)));
    c.start().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut sent_at = std::collections::BTreeMap::new();
    for (level, secs) in [(1, 1u64), (2, 5), (3, 10)] {
        for i in 0..3 {
            let body = format!("delay-{level}-{i}").into_bytes();
            let msg = Message::builder()
                .topic(topic)
                .tags("D")
                .delay_level(level)
                .body_slice(&body)
                .build_unchecked();
            p.send_with_timeout(msg, 5000).await?;
            sent_at.insert(body, (Instant::now(), secs));
        }
    }
    p.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && lock(&arrivals).iter().filter(|(b, _)| sent_at.contains_key(b)).count() < 9 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(SETTLE).await;
    c.shutdown().await;
    let got = lock(&arrivals).clone();
    let want: Vec<Vec<u8>> = std::iter::once(b"warm-up".to_vec())
        .chain(sent_at.keys().cloned())
        .collect();
    let bodies: Vec<Vec<u8>> = got.iter().map(|(b, _)| b.clone()).collect();
    let mut ok = exactly_once("delay", &want, &bodies);
    for (body, (at, secs)) in &sent_at {
        match got.iter().find(|(b, _)| b == body) {
            Some((_, arrived)) => {
                let took = arrived.duration_since(*at).as_secs_f64();
                println!(
                    "compat: {} arrived after {took:.2} s (level {secs} s)",
                    String::from_utf8_lossy(body)
                );
                ok &= (took - *secs as f64).abs() <= 1.0;
            }
            None => {
                println!("compat: {} never arrived", String::from_utf8_lossy(body));
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// `retry-dlq`: a consumer with maxReconsumeTimes 1 fails every message:
/// each comes back once from the retry topic (level 3, 10 s later) with its
/// original topic and body, then goes to `%DLQ%<group>`, where another group
/// reads it.
async fn retry_dlq(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const N: usize = 5;
    let topic = "CompatRetry";
    let group = "compat-cg-retry";
    let mut p = producer(rt, namesrv, "compat-pg-retry", 4).await?;
    let sent = bodies("retry", N);
    send_all(&p, topic, &sent).await?;
    p.shutdown().await;
    let attempts: Arc<Mutex<Vec<(Vec<u8>, i32, String)>>> = Arc::default();
    struct Fail(Arc<Mutex<Vec<(Vec<u8>, i32, String)>>>);
    impl MessageListenerConcurrently for Fail {
        fn consume_message(
            &self,
            msgs: &[&MessageExt],
            _c: &ConsumeConcurrentlyContext,
        ) -> ClientResult<ConsumeConcurrentlyStatus> {
            let mut g = lock(&self.0);
            for m in msgs {
                record(
                    &mut g,
                    (
                        m.body().map(|b| b.to_vec()).unwrap_or_default(),
                        m.reconsume_times(),
                        m.topic().to_string(),
                    ),
                );
            }
            Ok(ConsumeConcurrentlyStatus::ReconsumeLater)
        }
    }
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .max_reconsume_times(1)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_concurrently(Fail(Arc::clone(&attempts)));
    c.start().await?;
    let deadline = Instant::now() + Duration::from_secs(40);
    while Instant::now() < deadline && lock(&attempts).len() < 2 * N {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Long enough for a third delivery, which must not come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.shutdown().await;
    let attempts = lock(&attempts).clone();
    // Exactly maxReconsumeTimes + 1 = 2 attempts per message (the original,
    // reconsume times 0, and one from the retry topic, 1), nothing else.
    println!("compat: {} attempts in all (want {})", attempts.len(), 2 * N);
    let mut ok = attempts.len() == 2 * N && attempts.iter().all(|(b, _, _)| sent.contains(b));
    for b in &sent {
        let mine: Vec<_> = attempts.iter().filter(|(x, _, _)| x == b).collect();
        let times: Vec<i32> = mine.iter().map(|(_, t, _)| *t).collect();
        let topics: BTreeSet<&str> = mine.iter().map(|(_, _, t)| t.as_str()).collect();
        ok &= times == vec![0, 1] && topics == BTreeSet::from([topic]);
        println!(
            "compat: {} attempts (reconsume times {times:?}, topics {topics:?})",
            String::from_utf8_lossy(b)
        );
    }
    // Exactly one DLQ copy of each.
    let dlq = consume_all(rt, namesrv, "compat-cg-dlq-reader", &format!("%DLQ%{group}"), "*", N).await?;
    ok &= exactly_once("DLQ", &sent, &dlq);
    Ok(ok)
}

/// `delay-restart-1` sends 5 messages with level 3 (10 s) and exits; rokka
/// restarts; `delay-restart-2` must get each exactly once, no earlier than
/// 10 s after it was born.
async fn delay_restart(rt: &Arc<ClientRuntime>, namesrv: &str, phase: u32) -> ClientResult<bool> {
    let topic = "CompatDelayRestart";
    if phase == 1 {
        let mut p = producer(rt, namesrv, "compat-pg-delay-restart", 4).await?;
        for i in 0..5 {
            let msg = Message::builder()
                .topic(topic)
                .delay_level(3)
                .body_slice(format!("later-{i}").as_bytes())
                .build_unchecked();
            p.send_with_timeout(msg, 5000).await?;
        }
        p.shutdown().await;
        return Ok(true);
    }
    let got: Arc<Mutex<Vec<(Vec<u8>, i64)>>> = Arc::default();
    struct Born(Arc<Mutex<Vec<(Vec<u8>, i64)>>>);
    impl MessageListenerConcurrently for Born {
        fn consume_message(
            &self,
            msgs: &[&MessageExt],
            _c: &ConsumeConcurrentlyContext,
        ) -> ClientResult<ConsumeConcurrentlyStatus> {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let mut g = lock(&self.0);
            for m in msgs {
                g.push((
                    m.body().map(|b| b.to_vec()).unwrap_or_default(),
                    now - m.born_timestamp(),
                ));
            }
            Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
        }
    }
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group("compat-cg-delay-restart".to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_concurrently(Born(Arc::clone(&got)));
    c.start().await?;
    tokio::time::sleep(Duration::from_secs(16)).await;
    c.shutdown().await;
    let got = lock(&got).clone();
    for (b, age) in &got {
        println!(
            "compat: {} delivered {age} ms after its birth",
            String::from_utf8_lossy(b)
        );
    }
    let distinct: BTreeSet<&Vec<u8>> = got.iter().map(|(b, _)| b).collect();
    Ok(got.len() == 5 && distinct.len() == 5 && got.iter().all(|(_, age)| *age >= 9_000))
}

/// `query`: QUERY_MESSAGE by key (IndexFile) and VIEW_MESSAGE_BY_ID with the
/// offset message id a send returned.
async fn query(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    let topic = "CompatQuery";
    let mut p = producer(rt, namesrv, "compat-pg-query", 4).await?;
    let mut ids = Vec::new();
    let begin = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for i in 0..10 {
        let msg = Message::builder()
            .topic(topic)
            .key(format!("order-{}", i % 3))
            .body_slice(format!("q-{i}").as_bytes())
            .build_unchecked();
        let r = p.send_with_timeout(msg, 5000).await?;
        ids.push(r.and_then(|r| r.offset_msg_id).unwrap_or_default());
    }
    let found = p
        .query_message(topic, "order-1", 32, begin.saturating_sub(1000), begin + 600_000)
        .await?;
    let mut bodies: Vec<String> = found
        .message_list()
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body().map(|b| b.to_vec()).unwrap_or_default()).into_owned())
        .collect();
    bodies.sort();
    println!("compat: by key order-1: {bodies:?}");
    let mut ok = bodies == vec!["q-1", "q-4", "q-7"];
    let viewed = p.view_message(topic, &ids[5]).await?;
    let body = viewed.body().map(|b| b.to_vec()).unwrap_or_default();
    println!("compat: by id {}: {}", ids[5], String::from_utf8_lossy(&body));
    ok &= body == b"q-5";
    p.shutdown().await;
    Ok(ok)
}

/// Passes each delivery on to a task (a listener cannot await a send).
struct Forward(tokio::sync::mpsc::UnboundedSender<MessageExt>);

impl MessageListenerConcurrently for Forward {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        for m in msgs {
            let _ = self.0.send((*m).clone());
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

/// Request/reply: a requester's `request()` gets the reply a responder (a
/// push consumer of the request topic) makes with
/// MessageUtil::create_reply_message and sends — the broker stamps the
/// request with its CLUSTER, takes the reply (SEND_REPLY_MESSAGE_V2) and
/// pushes it to the requester's connection (PUSH_REPLY_MESSAGE_TO_CLIENT).
async fn request_reply(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    let topic = "CompatRequestReply";
    let mut requester = producer(rt, namesrv, "compat-pg-rr", 4).await?;
    // The topic made before the responder subscribes (its route is there).
    let first = Message::builder()
        .topic(topic)
        .body_slice(b"not-a-request")
        .build_unchecked();
    requester.send_with_timeout(first, 5000).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<MessageExt>();
    let mut consumer = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .client_config(client_config())
        .consumer_group("compat-cg-rr".to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    consumer.subscribe(topic, "*").await?;
    consumer.register_message_listener_concurrently(Forward(tx));
    consumer.start().await?;
    let responder = Arc::new(producer(rt, namesrv, "compat-pg-rr-responder", 4).await?);
    let replier = {
        let responder = Arc::clone(&responder);
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                let asked = m.body().map(|b| b.to_vec()).unwrap_or_default();
                let body = [b"reply:".as_slice(), &asked].concat();
                match rocketmq_client_rust::MessageUtil::create_reply_message(&m.message, &body) {
                    Ok(reply) => {
                        if let Err(e) = responder.send_with_timeout(reply, 5000).await {
                            println!("compat: reply to {} not sent: {e}", String::from_utf8_lossy(&asked));
                        }
                    }
                    // (The first message is no request: no CLUSTER on it.)
                    Err(e) => println!("compat: no reply to {}: {e}", String::from_utf8_lossy(&asked)),
                }
            }
        })
    };
    let mut ok = true;
    for i in 0..3 {
        let ask = format!("ask-{i}");
        let msg = Message::builder()
            .topic(topic)
            .body_slice(ask.as_bytes())
            .build_unchecked();
        match requester.request(msg, 20_000).await {
            Ok(reply) => {
                let body = reply.get_body().map(|b| b.to_vec()).unwrap_or_default();
                println!("compat: {ask} -> {}", String::from_utf8_lossy(&body));
                ok &= body == format!("reply:{ask}").into_bytes();
            }
            Err(e) => {
                println!("compat: request {ask} failed: {e}");
                ok = false;
            }
        }
    }
    replier.abort();
    consumer.shutdown().await;
    requester.shutdown().await;
    Ok(ok)
}

/// Executions (body, state) and broker checks (body, state answered).
#[derive(Default)]
struct TxSeen {
    executed: Mutex<Vec<(String, rocketmq_client_rust::LocalTransactionState)>>,
    checked: Mutex<Vec<(String, rocketmq_client_rust::LocalTransactionState)>>,
}

struct TxListener(Arc<TxSeen>);

impl rocketmq_client_rust::TransactionListener for TxListener {
    fn execute_local_transaction(
        &self,
        msg: &dyn rocketmq_model::common::message::MessageTrait,
        arg: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> rocketmq_client_rust::LocalTransactionState {
        use rocketmq_client_rust::LocalTransactionState as S;
        let state = match arg.and_then(|a| a.downcast_ref::<&'static str>()).copied() {
            Some("commit") => S::CommitMessage,
            Some("rollback") => S::RollbackMessage,
            _ => S::Unknown,
        };
        let body = msg
            .get_body()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        record(&mut lock(&self.0.executed), (body, state));
        state
    }

    /// "tx-unknown" answers UNKNOWN at its first check, COMMIT at the next;
    /// a body with "rollback" in it ROLLBACK, any other COMMIT.
    fn check_local_transaction(&self, msg: &MessageExt) -> rocketmq_client_rust::LocalTransactionState {
        use rocketmq_client_rust::LocalTransactionState as S;
        let body = msg
            .body()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let mut checked = lock(&self.0.checked);
        let before = checked.iter().filter(|(b, _)| *b == body).count();
        let state = if body == "tx-unknown" && before == 0 {
            S::Unknown
        } else if body.contains("rollback") {
            S::RollbackMessage
        } else {
            S::CommitMessage
        };
        record(&mut checked, (body, state));
        state
    }
}

/// `transactions` (rokka with short check timings): commit, rollback, and a
/// transaction left UNKNOWN that the broker checks back: the producer answers
/// UNKNOWN, then COMMIT. Consumers see exactly the two committed messages.
async fn transactions(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    use rocketmq_client_rust::{LocalTransactionState as S, TransactionMQProducer};
    let topic = "CompatTx";
    let seen = Arc::new(TxSeen::default());
    let mut producer = TransactionMQProducer::builder(Arc::clone(rt))
        .producer_group("compat-tx-pg".to_string())
        .name_server_addr(namesrv.to_string())
        .transaction_listener(TxListener(Arc::clone(&seen)))
        .check_thread_pool_min_size(1)
        .check_thread_pool_max_size(4)
        .check_request_hold_max(2000)
        .build();
    producer.start().await?;
    let mut ok = true;
    for (body, decide, expect) in [
        ("tx-commit", "commit", S::CommitMessage),
        ("tx-rollback", "rollback", S::RollbackMessage),
        ("tx-unknown", "unknown", S::Unknown),
    ] {
        let msg = Message::builder()
            .topic(topic)
            .tags("TagTx")
            .body_slice(body.as_bytes())
            .build_unchecked();
        let r = producer.send_message_in_transaction(msg, Some(decide)).await?;
        println!("compat: tx {body}: {:?}", r.local_transaction_state);
        ok &= r.local_transaction_state == Some(expect);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && lock(&seen.checked).len() < 2 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = consume_all(rt, namesrv, "compat-tx-cg", topic, "*", 2).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    producer.shutdown().await;
    // Exactly two checks, both of the open one (UNKNOWN, then COMMIT): none
    // of the resolved ones, and none once it is resolved.
    let checked = lock(&seen.checked).clone();
    println!("compat: tx checks {checked:?}");
    ok &= checked
        == [
            ("tx-unknown".to_string(), S::Unknown),
            ("tx-unknown".to_string(), S::CommitMessage),
        ];
    // The two committed ones exactly once, the rolled back one never.
    ok &= exactly_once("tx consumed", &[b"tx-commit".to_vec(), b"tx-unknown".to_vec()], &got);
    Ok(ok)
}

/// `orderly-group`: two orderly consumers of one group (queue locks, LOCK_BATCH_MQ)
/// share the queues; each order's messages reach one of them, in send order.
async fn orderly_group(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const ORDERS: u64 = 4;
    const PER: usize = 30;
    let topic = "CompatOrderlyGroup";
    let p = producer(rt, namesrv, "compat-pg-orderly-group", 4).await?;
    send_all(&p, topic, &[b"warm-up".to_vec()]).await?;
    let mut members = Vec::new();
    for _ in 0..2 {
        let seen: Seen = Arc::default();
        let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
            .consumer_group("compat-cg-orderly-group".to_string())
            .name_server_addr(namesrv.to_string())
            .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
            .build();
        c.subscribe(topic, "*").await?;
        c.register_message_listener_orderly(Orderly(Arc::clone(&seen)));
        c.start().await?;
        members.push((c, seen));
    }
    // Let both rebalance and lock their queues.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for seq in 0..PER {
        for id in 0..ORDERS {
            let msg = Message::builder()
                .topic(topic)
                .key(format!("order-{id}"))
                .raw_property("seq", seq.to_string())?
                .body_slice(format!("order-{id}-seq-{seq:03}").as_bytes())
                .build_unchecked();
            p.send_with_selector_timeout(
                msg,
                |mqs: &[MessageQueue], _m: &Message, id: &u64| {
                    (!mqs.is_empty()).then(|| mqs[(*id as usize) % mqs.len()].clone())
                },
                id,
                5000,
            )
            .await?;
        }
    }
    let mut p = p;
    p.shutdown().await;
    let total = || {
        members
            .iter()
            .map(|(_, s)| lock(s).iter().filter(|x| x.1.starts_with(b"order-")).count())
            .sum::<usize>()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && total() < ORDERS as usize * PER {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut ok = total() == ORDERS as usize * PER;
    let mut per_member = Vec::new();
    for (_, seen) in &members {
        let seen = lock(seen).clone();
        per_member.push(seen.iter().filter(|x| x.1.starts_with(b"order-")).count());
        for id in 0..ORDERS {
            let prefix = format!("order-{id}-");
            let mine: Vec<_> = seen.iter().filter(|s| s.1.starts_with(prefix.as_bytes())).collect();
            // An order is wholly in one member, in send order.
            let in_order = mine
                .iter()
                .enumerate()
                .all(|(seq, s)| s.1 == format!("order-{id}-seq-{seq:03}").into_bytes());
            ok &= mine.is_empty() || (mine.len() == PER && in_order);
        }
    }
    println!("compat: orderly group deliveries per member {per_member:?}");
    ok &= per_member.iter().all(|n| *n > 0);
    for (mut c, _) in members {
        c.shutdown().await;
    }
    Ok(ok)
}

/// `timer`: arbitrary delivery times — delay_secs(2), delay_millis(4000) and
/// deliver_time_ms(now + 6 s) — arrive on time within ±1 s, the earliest
/// first although sent last.
async fn timer(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    let topic = "CompatTimer";
    let mut p = producer(rt, namesrv, "compat-pg-timer", 4).await?;
    send_all(&p, topic, &[b"warm-up".to_vec()]).await?;
    let arrivals: Arc<Mutex<Vec<(Vec<u8>, Instant)>>> = Arc::default();
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group("compat-cg-timer".to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_concurrently(Arrive(Arc::clone(&arrivals)));
    c.start().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let epoch_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let mut sent_at = Vec::new();
    for (name, secs) in [("at-6s", 6.0), ("millis-4s", 4.0), ("secs-2s", 2.0)] {
        let b = Message::builder()
            .topic(topic)
            .tags("Timer")
            .body_slice(name.as_bytes());
        let msg = match name {
            "at-6s" => b.deliver_time_ms(epoch_ms() + 6000),
            "millis-4s" => b.delay_millis(4000),
            _ => b.delay_secs(2),
        }
        .build_unchecked();
        p.send_with_timeout(msg, 5000).await?;
        sent_at.push((name.as_bytes().to_vec(), Instant::now(), secs));
    }
    p.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && lock(&arrivals).iter().filter(|(b, _)| b != b"warm-up").count() < 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(SETTLE).await;
    c.shutdown().await;
    let got = lock(&arrivals).clone();
    let want: Vec<Vec<u8>> = std::iter::once(b"warm-up".to_vec())
        .chain(sent_at.iter().map(|(b, _, _)| b.clone()))
        .collect();
    let bodies: Vec<Vec<u8>> = got.iter().map(|(b, _)| b.clone()).collect();
    let mut ok = exactly_once("timer", &want, &bodies);
    for (body, at, secs) in &sent_at {
        match got.iter().find(|(b, _)| b == body) {
            Some((_, arrived)) => {
                let took = arrived.duration_since(*at).as_secs_f64();
                println!(
                    "compat: {} arrived after {took:.2} s (wanted {secs} s)",
                    String::from_utf8_lossy(body)
                );
                ok &= (took - secs).abs() <= 1.0;
            }
            None => {
                println!("compat: {} never arrived", String::from_utf8_lossy(body));
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// `tx-restart-1` commits one transaction, rolls one back and leaves two
/// UNKNOWN, then exits at once (no check can reach it: it must not see one);
/// rokka restarts; `tx-restart-2` starts a producer of the same group, which
/// must be checked for each open transaction exactly once, by the restarted
/// broker (it answers COMMIT for "txr-later", ROLLBACK for
/// "txr-later-rollback"; it commits one more, "txr-second-run", which also
/// gives it the broker connection checks arrive on): a consumer gets every
/// committed message exactly once and the rolled-back ones never.
async fn tx_restart(rt: &Arc<ClientRuntime>, namesrv: &str, phase: u32) -> ClientResult<bool> {
    use rocketmq_client_rust::{LocalTransactionState as S, TransactionMQProducer};
    let topic = "CompatTxRestart";
    let seen = Arc::new(TxSeen::default());
    let mut producer = TransactionMQProducer::builder(Arc::clone(rt))
        .producer_group("compat-tx-restart-pg".to_string())
        .name_server_addr(namesrv.to_string())
        .transaction_listener(TxListener(Arc::clone(&seen)))
        .check_thread_pool_min_size(1)
        .check_thread_pool_max_size(4)
        .check_request_hold_max(2000)
        .build();
    producer.start().await?;
    if phase == 1 {
        let mut ok = true;
        for (body, decide, expect) in [
            ("txr-commit", "commit", S::CommitMessage),
            ("txr-rollback", "rollback", S::RollbackMessage),
            ("txr-later", "unknown", S::Unknown),
            ("txr-later-rollback", "unknown", S::Unknown),
        ] {
            let msg = Message::builder()
                .topic(topic)
                .body_slice(body.as_bytes())
                .build_unchecked();
            let r = producer.send_message_in_transaction(msg, Some(decide)).await?;
            println!("compat: tx {body}: {:?}", r.local_transaction_state);
            ok &= r.local_transaction_state == Some(expect);
        }
        if fault().as_deref() == Some("tx-linger") {
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        producer.shutdown().await;
        let checks = lock(&seen.checked).clone();
        println!("compat: checks before the restart {checks:?} (want none)");
        return Ok(ok && checks.is_empty());
    }
    let msg = Message::builder()
        .topic(topic)
        .body_slice(b"txr-second-run")
        .build_unchecked();
    let r = producer.send_message_in_transaction(msg, Some("commit")).await?;
    let mut ok = r.local_transaction_state == Some(S::CommitMessage);
    let want_checks = vec![
        ("txr-later".to_string(), S::CommitMessage),
        ("txr-later-rollback".to_string(), S::RollbackMessage),
    ];
    let sorted_checks = || {
        let mut c = lock(&seen.checked).clone();
        c.sort_by(|a, b| a.0.cmp(&b.0));
        c
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    while Instant::now() < deadline && lock(&seen.checked).len() < want_checks.len() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "compat: checks after the restart (within {:.1} s): {:?}",
        started.elapsed().as_secs_f64(),
        sorted_checks()
    );
    let got = consume_all(rt, namesrv, "compat-cg-tx-restart", topic, "*", 3).await?;
    // Resolved transactions are never checked again (the broker checks every
    // 500 ms here: several rounds have passed).
    tokio::time::sleep(Duration::from_secs(2)).await;
    producer.shutdown().await;
    let checks = sorted_checks();
    println!("compat: checks in all {checks:?} (want {want_checks:?}, each once)");
    ok &= checks == want_checks;
    ok &= exactly_once(
        "tx-restart consumed",
        &[
            b"txr-commit".to_vec(),
            b"txr-later".to_vec(),
            b"txr-second-run".to_vec(),
        ],
        &got,
    );
    Ok(ok)
}

/// Records each body with the instant it arrived.
struct Arrive(Arc<Mutex<Vec<(Vec<u8>, Instant)>>>);

impl MessageListenerConcurrently for Arrive {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let now = Instant::now();
        let mut g = lock(&self.0);
        for m in msgs {
            record(&mut g, (m.body().map(|b| b.to_vec()).unwrap_or_default(), now));
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

/// Queues of the takeover topics.
const TAKEOVER_QUEUES: usize = 4;
/// Messages per queue before member A dies, and after.
const TAKEOVER_PER_QUEUE: usize = 10;
/// The members' heartbeat interval (the client's minimum).
const HEARTBEAT_MS: u64 = 10_000;
/// How often rokka looks for clients silent past `client_timeout_ms`
/// (crates/server/src/main.rs).
const EXPIRY_SWEEP_MS: u64 = 10_000;

fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Deliveries with their queue and arrival time (epoch ms).
type Timed = Arc<Mutex<Vec<(i32, Vec<u8>, u64)>>>;

struct TimedListener(Timed);

impl TimedListener {
    fn note(&self, msgs: &[&MessageExt]) {
        let now = epoch_ms();
        let mut g = lock(&self.0);
        for m in msgs {
            record(
                &mut g,
                (m.queue_id(), m.body().map(|b| b.to_vec()).unwrap_or_default(), now),
            );
        }
    }
}

impl MessageListenerConcurrently for TimedListener {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        self.note(msgs);
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

impl MessageListenerOrderly for TimedListener {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _ctx: &mut ConsumeOrderlyContext,
    ) -> ClientResult<ConsumeOrderlyStatus> {
        self.note(msgs);
        Ok(ConsumeOrderlyStatus::Success)
    }
}

/// The takeover variants: `push` (a push consumer killed with SIGKILL: its
/// connection closes), `hang` (a push consumer stopped with SIGSTOP: its
/// connection stays open, its heartbeats stop), `orderly` (an orderly
/// consumer killed with SIGKILL while holding its queue locks).
fn takeover_names(variant: &str) -> Option<(String, String)> {
    matches!(variant, "push" | "hang" | "orderly").then(|| {
        let v = variant[..1].to_uppercase() + &variant[1..];
        (format!("CompatTakeover{v}"), format!("compat-cg-takeover-{variant}"))
    })
}

/// A member of the variant's group, instance name `instance` (client id
/// `<ip>@<instance>`), heartbeating every HEARTBEAT_MS, persisting offsets
/// every second.
async fn takeover_member(
    rt: &Arc<ClientRuntime>,
    namesrv: &str,
    variant: &str,
    instance: &str,
    got: &Timed,
) -> ClientResult<DefaultMQPushConsumer> {
    let (topic, group) = takeover_names(variant).unwrap_or_default();
    let mut cfg = ClientConfig::default();
    cfg.set_instance_name(instance.into());
    cfg.set_heartbeat_broker_interval(HEARTBEAT_MS as u32);
    cfg.set_persist_consumer_offset_interval(1000);
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .client_config(cfg)
        .consumer_group(group)
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .await_termination_millis_when_shutdown(5000)
        .build();
    c.subscribe(topic.as_str(), "*").await?;
    if variant == "orderly" {
        c.register_message_listener_orderly(TimedListener(Arc::clone(got)));
    } else {
        c.register_message_listener_concurrently(TimedListener(Arc::clone(got)));
    }
    c.start().await?;
    Ok(c)
}

/// Sends `per_queue` messages to each queue of `topic` (queue i % queues,
/// round after round; body `<prefix>-q<i>-<seq>`): the bodies in send order
/// with the queue id each went to.
async fn send_to_every_queue(
    rt: &Arc<ClientRuntime>,
    namesrv: &str,
    group: &str,
    topic: &str,
    prefix: &str,
    per_queue: usize,
) -> ClientResult<Vec<(Vec<u8>, i32)>> {
    let mut p = producer(rt, namesrv, group, TAKEOVER_QUEUES as u32).await?;
    let mut sent = Vec::new();
    for seq in 0..per_queue {
        for q in 0..TAKEOVER_QUEUES as u64 {
            let body = format!("{prefix}-q{q}-{seq:03}").into_bytes();
            let msg = Message::builder().topic(topic).body_slice(&body).build_unchecked();
            let r = p
                .send_with_selector_timeout(
                    msg,
                    |mqs: &[MessageQueue], _m: &Message, q: &u64| {
                        (!mqs.is_empty()).then(|| mqs[(*q as usize) % mqs.len()].clone())
                    },
                    q,
                    5000,
                )
                .await?;
            sent.push((body, r.and_then(|r| r.message_queue).map_or(-1, |mq| mq.queue_id())));
        }
    }
    p.shutdown().await;
    Ok(sent)
}

/// `dying-member <push|hang|orderly>`: member A. Sends TAKEOVER_PER_QUEUE
/// messages to each of the topic's queues (creating it), consumes them all
/// alone (an orderly consumer: holding every queue's lock), waits until its
/// offsets have reached the broker (the client's first persist run is 10 s
/// after its start), prints `compat: ready`, and then holds its queues until
/// it is killed or stopped (exiting non-zero after 150 s if nobody did).
async fn dying_member(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let variant = args.first().map_or("", String::as_str);
    let Some((topic, _)) = takeover_names(variant) else {
        println!("compat: dying-member: unknown variant {variant:?}");
        return Ok(false);
    };
    let started = Instant::now();
    // (The topic exists before the consumer subscribes.)
    let sent = send_to_every_queue(
        rt,
        namesrv,
        &format!("compat-pg-takeover-{variant}-a"),
        &topic,
        "pre",
        TAKEOVER_PER_QUEUE,
    )
    .await?;
    let got: Timed = Arc::default();
    let mut c = takeover_member(rt, namesrv, variant, "takeover-a", &got).await?;
    let want = sent.len();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let distinct: BTreeSet<Vec<u8>> = lock(&got).iter().map(|(_, b, _)| b.clone()).collect();
        if distinct.len() >= want || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Offsets reach the broker from the first persist run on; then a little
    // longer (a duplicate would show up too).
    let ready_at = Duration::from_secs(13).max(started.elapsed() + SETTLE);
    tokio::time::sleep(ready_at.saturating_sub(started.elapsed())).await;
    let got = lock(&got).clone();
    let queues: BTreeSet<i32> = got.iter().map(|(q, _, _)| *q).collect();
    let sent_queues: BTreeSet<i32> = sent.iter().map(|(_, q)| *q).collect();
    let bodies: Vec<Vec<u8>> = got.iter().map(|(_, b, _)| b.clone()).collect();
    let want_bodies: Vec<Vec<u8>> = sent.iter().map(|(b, _)| b.clone()).collect();
    let ok = exactly_once(&format!("member A ({variant})"), &want_bodies, &bodies)
        && queues.len() == TAKEOVER_QUEUES
        && sent_queues == queues;
    if !ok {
        println!("compat: member A consumed from queues {queues:?}, sent to {sent_queues:?}");
        c.shutdown().await;
        return Ok(false);
    }
    println!(
        "compat: ready: member A consumed {want} from queues {queues:?} and holds them until killed ({:.1} s after its start)",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(150)).await;
    println!("compat: member A was never killed");
    c.shutdown().await;
    Ok(false)
}

/// `takeover <push|hang|orderly> <A gone at, epoch ms> <client_timeout_ms>
/// [lock_expiry_ms]`: member B, started right after member A died (SIGKILL)
/// or hung (SIGSTOP) without shutting down, in the same group. B sends
/// TAKEOVER_PER_QUEUE messages to each queue and must consume each of them
/// exactly once (and none of A's, whose offsets A committed), every queue's
/// in send order, and take over A's queues exactly when the broker lets go
/// of A:
/// - `push`: A's connection closed, so the broker drops A at once (docs:
///   clients expire "when their connection closes"); B owns every queue from
///   its first rebalance: every queue delivers within a few seconds, long
///   before `client_timeout_ms` could have expired A;
/// - `hang`: A's connection stays open; the broker expires A once it has
///   been silent for `client_timeout_ms` (its last heartbeat was at most
///   HEARTBEAT_MS before it stopped; the sweep runs every EXPIRY_SWEEP_MS).
///   Until then B owns half the queues (delivering at once), A's half
///   delivers only from then on;
/// - `orderly`: A held every queue's lock (renewed every
///   `rocketmq.client.rebalance.lockInterval`); a lock not renewed for
///   `lock_expiry_ms` can be taken over, no earlier: B delivers nothing from
///   any queue before A's last renewal + `lock_expiry_ms`, and everything
///   soon after.
async fn takeover(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let variant = args.first().map_or("", String::as_str);
    let num = |i: usize| args.get(i).and_then(|s| s.parse::<u64>().ok());
    let (Some((topic, _)), Some(gone), Some(client_timeout)) = (takeover_names(variant), num(1), num(2)) else {
        println!("compat: usage: takeover <push|hang|orderly> <gone-at-ms> <client_timeout_ms> [lock_expiry_ms]");
        return Ok(false);
    };
    let lock_expiry = num(3).unwrap_or(60_000);
    let lock_interval: u64 = std::env::var("rocketmq.client.rebalance.lockInterval")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    // When A's queues may first deliver to B, and by when they must (ms
    // after A died); 1 s of slack for the clocks of two processes and rokka.
    let (earliest, latest) = match variant {
        "push" => (0, 12_000),
        "hang" => (
            client_timeout.saturating_sub(HEARTBEAT_MS + 1000),
            client_timeout + EXPIRY_SWEEP_MS + 6000,
        ),
        _ => (lock_expiry.saturating_sub(lock_interval + 1000), lock_expiry + 6000),
    };
    println!(
        "compat: takeover ({variant}): B starts {} ms after A died; A's queues may deliver to B from +{:.1} s, must by +{:.1} s",
        epoch_ms().saturating_sub(gone),
        earliest as f64 / 1000.0,
        latest as f64 / 1000.0
    );
    let got: Timed = Arc::default();
    let mut c = takeover_member(rt, namesrv, variant, "takeover-b", &got).await?;
    let sent = send_to_every_queue(
        rt,
        namesrv,
        &format!("compat-pg-takeover-{variant}-b"),
        &topic,
        "post",
        TAKEOVER_PER_QUEUE,
    )
    .await?;
    let sent_done = epoch_ms();
    let want = sent.len();
    while epoch_ms() < gone + latest + 2000 {
        let distinct: BTreeSet<Vec<u8>> = lock(&got).iter().map(|(_, b, _)| b.clone()).collect();
        if distinct.len() >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(SETTLE).await;
    c.shutdown().await;
    let got = lock(&got).clone();

    let bodies: Vec<Vec<u8>> = got.iter().map(|(_, b, _)| b.clone()).collect();
    let want_bodies: Vec<Vec<u8>> = sent.iter().map(|(b, _)| b.clone()).collect();
    let mut ok = exactly_once(&format!("member B ({variant})"), &want_bodies, &bodies);
    // Each message from the queue it was sent to, each queue in send order.
    let queue_of: BTreeMap<&[u8], i32> = sent.iter().map(|(b, q)| (b.as_slice(), *q)).collect();
    let misplaced = got
        .iter()
        .filter(|(q, b, _)| queue_of.get(b.as_slice()).is_some_and(|sq| sq != q))
        .count();
    let queues: BTreeSet<i32> = sent.iter().map(|(_, q)| *q).collect();
    if misplaced > 0 || queues.len() != TAKEOVER_QUEUES {
        println!("compat: {misplaced} deliveries from another queue than sent to; sent to queues {queues:?}");
        ok = false;
    }
    let mut early = Vec::new();
    let mut late = Vec::new();
    for q in &queues {
        let mine: Vec<&(i32, Vec<u8>, u64)> = got.iter().filter(|(gq, _, _)| gq == q).collect();
        let order: Vec<&Vec<u8>> = sent.iter().filter(|(_, sq)| sq == q).map(|(b, _)| b).collect();
        let in_order = mine.iter().map(|(_, b, _)| b).eq(order.iter().copied());
        let Some(first) = mine.iter().map(|(_, _, at)| *at).min() else {
            println!(
                "compat: queue {q}: nothing delivered to B by +{:.1} s",
                latest as f64 / 1000.0
            );
            ok = false;
            continue;
        };
        let after = first.saturating_sub(gone);
        println!(
            "compat: queue {q}: {} deliveries to B, the first +{:.1} s after A died",
            mine.len(),
            after as f64 / 1000.0,
        );
        // (A push consumer's concurrent listener may see a queue out of order.)
        if variant == "orderly" && !in_order {
            println!("compat: queue {q}: NOT in send order");
            ok = false;
        }
        if after > latest {
            println!("compat: queue {q}: taken over too late");
            ok = false;
        }
        if after < earliest {
            early.push(*q);
        } else {
            late.push(*q);
        }
    }
    match variant {
        // A is gone before B starts: no queue waits.
        "push" => {
            if queues.len() > early.len() + late.len() {
                println!(
                    "compat: push: the broker still counts the killed member A (B owns {:?} only): \
                     it did not drop A when A's connection closed",
                    late
                );
            }
        }
        // B's half at once (before A could have expired), A's half after.
        "hang" => {
            if early.len() != TAKEOVER_QUEUES / 2 || late.len() != TAKEOVER_QUEUES / 2 {
                println!(
                    "compat: hang: B's queues from the start {early:?}, taken over from A {late:?} (want {} each)",
                    TAKEOVER_QUEUES / 2
                );
                ok = false;
            }
        }
        // Every queue was locked by A.
        _ => {
            if !early.is_empty() {
                println!("compat: orderly: queues {early:?} delivered to B before A's locks could have expired");
                ok = false;
            }
        }
    }
    println!(
        "compat: takeover ({variant}): B's sends done +{:.1} s after A died",
        sent_done.saturating_sub(gone) as f64 / 1000.0
    );
    Ok(ok)
}
