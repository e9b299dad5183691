//! Scenarios for `compat-tests/cross/test_durability.py`,
//! `test_retention.py` and `test_refusals.py`. Each prints what it saw as
//! it happens (`compat: ` lines, flushed per line), so a test that SIGKILLs
//! rokka — or this process — still has the record up to that moment, and
//! leaves every judgement to the Python test (the verdict is `ok` unless the
//! client itself could not start).
//!
//! * `dur-send <topic> <prefix> <n> [seconds] [pause_ms] [stop_file]` — up to
//!   `n` sync sends, one attempt each (`retry_times_when_send_failed(0)`, so
//!   an acknowledged message was stored by exactly one request), bodies
//!   `<prefix>-<i>`; errors are printed and sending goes on (rokka may be
//!   down); ends after `seconds` or when `stop_file` exists. Lines:
//!   `acked <body> <queue> <offset> <status>`, `failed <body> <error>`.
//! * `dur-delayed <topic> <name>:<level>:<timer_ms>:<n> ...` — for each
//!   spec, `n` sync sends of bodies `<name>-<i>` with delay level `level`
//!   (0 = none) or a timer `timer_ms` from now (0 = none). Lines:
//!   `acked <body> <epoch ms>`.
//! * `dur-consume <topic> <group> <seconds> [want] [fail_first] [stop_file]` — a
//!   clustering push consumer (offsets sent every second, the first time
//!   10 s after start — the client's fixed delay; from the first offset when
//!   the group has none). Lines: `started <epoch ms>`, then per delivery
//!   `got <epoch ms> <queue> <offset> <reconsume times> <body>`.
//!   Stops after `seconds`, or 2 s after `want` (> 0) deliveries, or when
//!   `stop_file` exists; then shuts
//!   down cleanly (persisting its offsets). With `fail_first` = 1 the
//!   listener answers RECONSUME_LATER the first time it sees a body.
//! * `dur-tx <phase> <topic> <group>` — phase 1: one transaction committed
//!   (`dtx-commit`), one rolled back (`dtx-rollback`), one left UNKNOWN
//!   (`dtx-open`), then exits without answering any check. Phase 2 (after
//!   rokka restarted): a transactional producer of the same group commits
//!   `dtx-second` (a producer only heartbeats to brokers it sent to) and
//!   answers every check — COMMIT for `dtx-open`, ROLLBACK for anything
//!   else; it waits up to 30 s for the check of `dtx-open`, then 3 s more.
//!   Lines: `executed <body> <state>`, `sent <body> <state>`, `check <body>`.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rocketmq_client_rust::{
    ClientConfig, ClientResult, ClientRuntime, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    DefaultMQProducer, DefaultMQPushConsumer, LocalTransactionState, MQPushConsumer, MessageListenerConcurrently,
    TransactionListener, TransactionMQProducer,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One `compat:` line, flushed at once (the process may be killed next).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "compat: {line}");
    let _ = out.flush();
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An error as one line.
fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().replace(['\n', '\r'], " ")
}

/// The client's defaults with the route poll interval from
/// `ROKKA_RMQ_POLL_NAMESRV_MS` (the cluster suite uses the client's minimum,
/// 10 s, so a failover reaches the client within one poll; the default is
/// 30 s); None when it is not set, so other suites keep the builders' own
/// defaults untouched.
fn poll_config() -> Option<ClientConfig> {
    let ms = std::env::var("ROKKA_RMQ_POLL_NAMESRV_MS").ok()?.parse().ok()?;
    let mut cfg = ClientConfig::default();
    cfg.set_poll_name_server_interval(ms);
    Some(cfg)
}

async fn start_producer(rt: &Arc<ClientRuntime>, namesrv: &str, group: &str) -> ClientResult<DefaultMQProducer> {
    let mut b = DefaultMQProducer::builder(Arc::clone(rt));
    if let Some(cfg) = poll_config() {
        b = b.client_config(cfg);
    }
    let mut p = b
        .producer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .default_topic_queue_nums(4)
        .retry_times_when_send_failed(0)
        .build();
    p.start().await?;
    Ok(p)
}

/// `dur-send`.
pub async fn send(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("DurSend", String::as_str);
    let prefix = args.get(1).map_or("m", String::as_str);
    let n: usize = arg(args, 2, 10);
    let seconds: u64 = arg(args, 3, 60);
    let pause = Duration::from_millis(arg(args, 4, 0));
    let stop_file = args.get(5).cloned();
    let mut p = start_producer(rt, namesrv, &format!("dur-pg-{prefix}")).await?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut acked, mut failed) = (0, 0);
    for i in 0..n {
        if Instant::now() >= deadline || stop_file.as_deref().is_some_and(|f| std::path::Path::new(f).exists()) {
            break;
        }
        let body = format!("{prefix}-{i}");
        let msg = Message::builder()
            .topic(topic)
            .tags("D")
            .key(body.as_str())
            .body_slice(body.as_bytes())
            .build_unchecked();
        match p.send_with_timeout(msg, 3000).await {
            Ok(Some(r)) => {
                let q = r.message_queue.as_ref().map_or(-1, |mq| mq.queue_id());
                let status = format!("{:?}", r.send_status);
                if status == "SendOk" {
                    acked += 1;
                    say(&format!("acked {body} {q} {} {status}", r.queue_offset));
                } else {
                    failed += 1;
                    say(&format!("failed {body} status {status}"));
                }
            }
            Ok(None) => {
                failed += 1;
                say(&format!("failed {body} no send result"));
            }
            Err(e) => {
                failed += 1;
                say(&format!("failed {body} {}", one_line(&e)));
                // rokka is probably down: do not spin.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    p.shutdown().await;
    say(&format!("sent {acked} acked, {failed} failed"));
    Ok(true)
}

/// `dur-delayed`.
pub async fn delayed(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("DurDelayed", String::as_str);
    let mut p = start_producer(rt, namesrv, "dur-pg-delayed").await?;
    let mut ok = true;
    for spec in &args[1.min(args.len())..] {
        let parts: Vec<&str> = spec.split(':').collect();
        let [name, level, timer_ms, n] = parts[..] else {
            say(&format!("bad spec {spec}"));
            ok = false;
            continue;
        };
        let level: i32 = level.parse().unwrap_or(0);
        let timer_ms: u64 = timer_ms.parse().unwrap_or(0);
        let n: usize = n.parse().unwrap_or(0);
        for i in 0..n {
            let body = format!("{name}-{i}");
            let mut b = Message::builder()
                .topic(topic)
                .tags("Later")
                .key(body.as_str())
                .body_slice(body.as_bytes());
            if level > 0 {
                b = b.delay_level(level);
            }
            if timer_ms > 0 {
                b = b.delay_millis(timer_ms);
            }
            match p.send_with_timeout(b.build_unchecked(), 5000).await {
                Ok(Some(r)) => say(&format!("acked {body} {} {:?}", now_ms(), r.send_status)),
                Ok(None) => {
                    ok = false;
                    say(&format!("failed {body} no send result"));
                }
                Err(e) => {
                    ok = false;
                    say(&format!("failed {body} {}", one_line(&e)));
                }
            }
        }
    }
    p.shutdown().await;
    Ok(ok)
}

struct Deliveries {
    count: Arc<Mutex<usize>>,
    seen: Mutex<BTreeSet<Vec<u8>>>,
    fail_first: bool,
}

impl MessageListenerConcurrently for Deliveries {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _c: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let now = now_ms();
        let mut later = false;
        for m in msgs {
            let body = m.body().map(|b| b.to_vec()).unwrap_or_default();
            say(&format!(
                "got {now} {} {} {} {}",
                m.queue_id(),
                m.queue_offset(),
                m.reconsume_times(),
                String::from_utf8_lossy(&body).replace(char::is_whitespace, "_"),
            ));
            *guard(&self.count) += 1;
            if self.fail_first && guard(&self.seen).insert(body) {
                later = true;
            }
        }
        Ok(if later {
            ConsumeConcurrentlyStatus::ReconsumeLater
        } else {
            ConsumeConcurrentlyStatus::ConsumeSuccess
        })
    }
}

/// `dur-consume`.
pub async fn consume(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let topic = args.first().map_or("DurConsume", String::as_str);
    let group = args.get(1).map_or("dur-cg", String::as_str);
    let seconds: u64 = arg(args, 2, 30);
    let want: usize = arg(args, 3, 0);
    let fail_first = arg(args, 4, 0u32) == 1;
    let stop_file = args.get(5).cloned();
    let stopped = || stop_file.as_deref().is_some_and(|f| std::path::Path::new(f).exists());
    let count = Arc::new(Mutex::new(0usize));
    let mut cfg = poll_config().unwrap_or_default();
    cfg.set_persist_consumer_offset_interval(1000);
    let mut c = DefaultMQPushConsumer::builder(Arc::clone(rt))
        .client_config(cfg)
        .consumer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .await_termination_millis_when_shutdown(5000)
        .build();
    c.subscribe(topic, "*").await?;
    c.register_message_listener_concurrently(Deliveries {
        count: Arc::clone(&count),
        seen: Mutex::default(),
        fail_first,
    });
    c.start().await?;
    say(&format!("started {}", now_ms()));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline && (want == 0 || *guard(&count) < want) && !stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if want > 0 && Instant::now() < deadline {
        // Long enough for a delivery too many to show.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    c.shutdown().await;
    say(&format!("consumed {}", *guard(&count)));
    Ok(true)
}

struct TxAnswers;

impl TransactionListener for TxAnswers {
    fn execute_local_transaction(
        &self,
        msg: &dyn rocketmq_model::common::message::MessageTrait,
        _arg: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> LocalTransactionState {
        let body = msg
            .get_body()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        let state = match body.as_str() {
            "dtx-commit" | "dtx-second" => LocalTransactionState::CommitMessage,
            "dtx-rollback" => LocalTransactionState::RollbackMessage,
            _ => LocalTransactionState::Unknown,
        };
        say(&format!("executed {body} {state:?}"));
        state
    }

    fn check_local_transaction(&self, msg: &MessageExt) -> LocalTransactionState {
        let body = msg
            .body()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        say(&format!("check {body}"));
        if body == "dtx-open" {
            CHECKED_OPEN.store(true, std::sync::atomic::Ordering::Relaxed);
            LocalTransactionState::CommitMessage
        } else {
            LocalTransactionState::RollbackMessage
        }
    }
}

/// `dur-tx`.
pub async fn tx(rt: &Arc<ClientRuntime>, namesrv: &str, args: &[String]) -> ClientResult<bool> {
    let phase: u32 = arg(args, 0, 1);
    let topic = args.get(1).map_or("DurTx", String::as_str);
    let group = args.get(2).map_or("dur-tx-pg", String::as_str);
    let mut producer = TransactionMQProducer::builder(Arc::clone(rt))
        .producer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .transaction_listener(TxAnswers)
        .check_thread_pool_min_size(1)
        .check_thread_pool_max_size(4)
        .check_request_hold_max(2000)
        .build();
    producer.start().await?;
    let bodies: &[&str] = if phase == 1 {
        &["dtx-commit", "dtx-rollback", "dtx-open"]
    } else {
        &["dtx-second"]
    };
    for body in bodies {
        let msg = Message::builder()
            .topic(topic)
            .body_slice(body.as_bytes())
            .build_unchecked();
        let r = producer.send_message_in_transaction(msg, Some(())).await?;
        say(&format!("sent {body} {:?}", r.local_transaction_state));
    }
    if phase == 2 {
        // The listener prints every check; wait for the expected one.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && !CHECKED_OPEN.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Time for checks that should not come.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    producer.shutdown().await;
    say("done");
    Ok(true)
}

/// Whether the check of `dtx-open` arrived.
static CHECKED_OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
