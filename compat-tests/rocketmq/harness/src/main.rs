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
//! everything).

#![recursion_limit = "512"]

use std::collections::BTreeSet;
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

struct Collect(Arc<Mutex<BTreeSet<Vec<u8>>>>);

impl MessageListenerConcurrently for Collect {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for m in msgs {
            if let Some(b) = m.body() {
                seen.insert(b.to_vec());
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

#[tokio::main]
async fn main() -> ClientResult<()> {
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
        "orderly-group" => orderly_group(&rt, &namesrv).await?,
        "transactions" => transactions(&rt, &namesrv).await?,
        "tx-restart-1" => tx_restart(&rt, &namesrv, 1).await?,
        "tx-restart-2" => tx_restart(&rt, &namesrv, 2).await?,
        "delay-restart-1" => delay_restart(&rt, &namesrv, 1).await?,
        "delay-restart-2" => delay_restart(&rt, &namesrv, 2).await?,
        "retry-dlq" => retry_dlq(&rt, &namesrv).await?,
        "cross-produce" => cross_produce(&rt, &namesrv, &args[3..]).await?,
        "cross-consume" => cross_consume(&rt, &namesrv, &args[3..]).await?,
        "cross-member" => cross_member(&rt, &namesrv, &args[3..]).await?,
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
        .producer_group("compat-pg".to_string())
        .name_server_addr(namesrv.to_string())
        .build();
    producer.start().await?;
    let mut sent = BTreeSet::new();
    for i in 0..N {
        let body = format!("compat-{i}-{}", "x".repeat(i % 50)).into_bytes();
        let msg = Message::builder()
            .topic(topic)
            .tags(if i % 2 == 0 { "TagA" } else { "TagB" })
            .body_slice(&body)
            .build_unchecked();
        producer.send_with_timeout(msg, 5000).await?;
        sent.insert(body);
    }
    producer.shutdown().await;
    println!("compat: sent {N}");
    let got = consume_all(rt, namesrv, "compat-cg", topic, "*", N).await?;
    println!("compat: consumed {} distinct of {N}", got.len());
    Ok(got == sent)
}

async fn tag_filter(rt: &Arc<ClientRuntime>, namesrv: &str) -> ClientResult<bool> {
    const N: usize = 150;
    let topic = "CompatTagFilter";
    let mut producer = DefaultMQProducer::builder(Arc::clone(rt))
        .producer_group("compat-pg-tags".to_string())
        .name_server_addr(namesrv.to_string())
        .build();
    producer.start().await?;
    let mut wanted = BTreeSet::new();
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
            wanted.insert(body);
        }
    }
    producer.shutdown().await;
    let got = consume_all(rt, namesrv, "compat-cg-tags", topic, "TagA || TagB", wanted.len()).await?;
    // A little longer: a TagC delivery would show up now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("compat: tag filter: {} received, {} wanted", got.len(), wanted.len());
    Ok(got == wanted)
}

/// A push consumer from the first offset with `expr`, until `want` distinct
/// bodies arrived or 60 s passed.
async fn consume_all(
    rt: &Arc<ClientRuntime>,
    namesrv: &str,
    group: &str,
    topic: &str,
    expr: &str,
    want: usize,
) -> ClientResult<BTreeSet<Vec<u8>>> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let mut consumer = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    consumer.subscribe(topic, expr).await?;
    consumer.register_message_listener_concurrently(Collect(Arc::clone(&seen)));
    consumer.start().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && seen.lock().unwrap_or_else(|p| p.into_inner()).len() < want {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    consumer.shutdown().await;
    let got = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
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
    let mut sent = BTreeSet::new();
    for i in 0..50 {
        let (m, b) = msg("sync", i);
        producer.send_with_timeout(m, 5000).await?;
        sent.insert(b);
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
        sent.insert(b);
    }
    for i in 0..50 {
        let (m, b) = msg("oneway", i);
        producer.send_oneway(m).await?;
        sent.insert(b);
    }
    for batch in 0..5 {
        let mut msgs = Vec::new();
        for j in 0..10 {
            let (m, b) = msg("batch", batch * 10 + j);
            msgs.push(m);
            sent.insert(b);
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
    println!(
        "send kinds: async callbacks {async_ok}/50, consumed {} of {}",
        got.len(),
        sent.len()
    );
    Ok(async_ok == 50 && got == sent)
}

async fn producer(rt: &Arc<ClientRuntime>, namesrv: &str, group: &str, queues: u32) -> ClientResult<DefaultMQProducer> {
    let mut p = DefaultMQProducer::builder(Arc::clone(rt))
        .producer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .default_topic_queue_nums(queues)
        .build();
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
            g.push((
                m.queue_id(),
                m.body().map(|b| b.to_vec()).unwrap_or_default(),
                m.keys(),
                m.property("seq").map(String::from),
            ));
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
    c.register_message_listener_concurrently(Record(Arc::clone(&got)));
    c.start().await?;
    Ok((c, got))
}

struct Record(Arc<Mutex<Vec<Vec<u8>>>>);

impl MessageListenerConcurrently for Record {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let mut g = lock(&self.0);
        for m in msgs {
            g.push(m.body().map(|b| b.to_vec()).unwrap_or_default());
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
        c.register_message_listener_concurrently(Record(Arc::clone(&got)));
        c.start().await?;
        consumers.push((c, got));
    }
    let mut ok = true;
    for (_, got) in &consumers {
        let all = wait_union(&[got], N).await;
        ok &= all == sent.iter().cloned().collect();
    }
    for (mut c, got) in consumers {
        c.shutdown().await;
        println!("compat: broadcast: a consumer got {} deliveries", lock(&got).len());
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
        bench_send(&p, "BenchOneway", "oneway", 100, n(300_000), 4).await?;
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

/// `cross-produce <topic> <n>`: sync sends with keys, tags and user
/// properties, for a Kafka consumer to check (compat-tests/cross).
async fn cross_produce(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("Cross", String::as_str);
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut p = producer(rt, namesrv, "cross-pg", 4).await?;
    for i in 0..n {
        let body = format!("rmq-{i}-é").into_bytes();
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
/// empty), then shuts down (committing its offsets).
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
                    "{} {} {} {} {} {} {}",
                    m.queue_id(),
                    m.queue_offset(),
                    m.born_timestamp(),
                    hexs(&m.body().map(|b| b.to_vec()).unwrap_or_default()),
                    hexs(m.property("KEYS").unwrap_or_default().as_bytes()),
                    hexs(m.property("TAGS").unwrap_or_default().as_bytes()),
                    hexs(&p),
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

/// `cross-member <topic> <group> <seconds>`: a clustering push consumer
/// (offsets persisted every second) that runs for `seconds`, then shuts down
/// cleanly and prints every body it consumed (`compat: got <hex>`).
async fn cross_member(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("Cross", String::as_str);
    let group = args.get(1).map_or("cross-cg", String::as_str);
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let (mut c, got) = member(rt, namesrv, group, topic).await?;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    c.shutdown().await;
    let got = lock(&got).clone();
    for b in &got {
        println!("compat: got {}", hexs(b));
    }
    println!("compat: member consumed {}", got.len());
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
    c.shutdown().await;
    let mut ok = true;
    let got = lock(&arrivals).clone();
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
                g.push((
                    m.body().map(|b| b.to_vec()).unwrap_or_default(),
                    m.reconsume_times(),
                    m.topic().to_string(),
                ));
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
    let mut ok = attempts.len() == 2 * N;
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
    let dlq = consume_all(rt, namesrv, "compat-cg-dlq-reader", &format!("%DLQ%{group}"), "*", N).await?;
    println!("compat: DLQ holds {} of {N}", dlq.len());
    ok &= dlq == sent.iter().cloned().collect();
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
        lock(&self.0.executed).push((body, state));
        state
    }

    /// The unknown one answers UNKNOWN at the first check, COMMIT at the next.
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
        } else if body.starts_with("tx-rollback") {
            S::RollbackMessage
        } else {
            S::CommitMessage
        };
        checked.push((body, state));
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
    let checked = lock(&seen.checked).clone();
    println!("compat: tx checks {checked:?}");
    ok &= checked.len() >= 2
        && checked[0] == ("tx-unknown".to_string(), S::Unknown)
        && checked[1] == ("tx-unknown".to_string(), S::CommitMessage);
    let got = consume_all(rt, namesrv, "compat-tx-cg", topic, "*", 2).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Checks stop once the transaction is resolved.
    ok &= lock(&seen.checked).len() == checked.len();
    producer.shutdown().await;
    let want: BTreeSet<Vec<u8>> = [b"tx-commit".to_vec(), b"tx-unknown".to_vec()].into_iter().collect();
    println!(
        "compat: tx consumed {:?}",
        got.iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect::<Vec<_>>()
    );
    Ok(ok && got == want)
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
    c.shutdown().await;
    let got = lock(&arrivals).clone();
    let mut ok = true;
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

/// `tx-restart-1` commits one transaction and leaves one UNKNOWN, then
/// exits; rokka restarts; `tx-restart-2` starts a producer of the same group
/// (committing one more) that answers the check with COMMIT: consumers get
/// the three messages, each once.
async fn tx_restart(rt: &Arc<ClientRuntime>, namesrv: &str, phase: u32) -> ClientResult<bool> {
    use rocketmq_client_rust::TransactionMQProducer;
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
        for (body, decide) in [("txr-commit", "commit"), ("txr-later", "unknown")] {
            let msg = Message::builder()
                .topic(topic)
                .body_slice(body.as_bytes())
                .build_unchecked();
            producer.send_message_in_transaction(msg, Some(decide)).await?;
        }
        producer.shutdown().await;
        return Ok(true);
    }
    // A producer heartbeats only to brokers it has a route to: one send.
    let msg = Message::builder()
        .topic(topic)
        .body_slice(b"txr-second-run")
        .build_unchecked();
    producer.send_message_in_transaction(msg, Some("commit")).await?;
    // The listener answers UNKNOWN at the first check of "tx-unknown" only;
    // "txr-later" commits at its first check.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && lock(&seen.checked).is_empty() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen_checks = lock(&seen.checked).clone();
    println!("compat: checks after the restart {seen_checks:?}");
    let got = Arc::new(Mutex::new(Vec::new()));
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .consumer_group("compat-cg-tx-restart".to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_concurrently(Record(Arc::clone(&got)));
    c.start().await?;
    let all = wait_union(&[&got], 3).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.shutdown().await;
    producer.shutdown().await;
    let got = lock(&got).clone();
    println!(
        "compat: consumed {:?}",
        got.iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect::<Vec<_>>()
    );
    let want: BTreeSet<Vec<u8>> = [
        b"txr-commit".to_vec(),
        b"txr-later".to_vec(),
        b"txr-second-run".to_vec(),
    ]
    .into_iter()
    .collect();
    Ok(got.len() == 3 && all == want && seen_checks.iter().all(|(b, _)| b == "txr-later"))
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
            g.push((m.body().map(|b| b.to_vec()).unwrap_or_default(), now));
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}
