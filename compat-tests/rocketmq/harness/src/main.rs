//! `rokka-rocketmq-compat <namesrv> <scenario>`: runs one scenario with the
//! real RocketMQ client against a running rokka and exits non-zero on any
//! mismatch. Scenarios: `send-consume` (sync sends with tags, then a push
//! consumer reads every message back byte-exact), `tag-filter` (a
//! `TagA || TagB` subscription gets exactly those tags; this client hashes
//! the untrimmed tokens, so the broker must derive codes from the expression),
//! `send-kinds` (sync, async with callback, oneway and batch sends, all read
//! back).

#![recursion_limit = "512"]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketmq_client_rust::{
    ClientError, ClientResult, ClientRuntime, ClientRuntimeConfig, ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus, DefaultMQProducer, DefaultMQPushConsumer, MQPushConsumer, MessageListenerConcurrently,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
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
    let owner = RuntimeOwner::plan(RuntimeConfig {
        thread_name: "rokka-compat".into(),
        ..Default::default()
    })
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
        other => {
            eprintln!("unknown scenario {other}");
            false
        }
    };
    let _ = rt.shutdown().await;
    println!("RESULT {scenario} {}", if ok { "ok" } else { "FAILED" });
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
    println!("sent {N}");
    let got = consume_all(rt, namesrv, "compat-cg", topic, "*", N).await?;
    println!("consumed {} distinct of {N}", got.len());
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
    println!("tag filter: {} received, {} wanted", got.len(), wanted.len());
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
