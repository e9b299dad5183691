//! `rokka-rmq5-rust <host:port> send-receive <topic> <group> <n>`: Apache's
//! Rust RocketMQ 5 client (crates.io `rocketmq` 5.0.0) against rokka's gRPC
//! listener. A producer sends `n` messages (tag, key, body); a
//! SimpleConsumer receives them, leaves the first one unacked so it comes
//! back with delivery attempt 2 after its invisible time, and acks the rest.
//! Prints `compat: got <attempt> <body>` per delivery and exits 0 when every
//! body came back byte-exact, once acked, and the unacked one twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rocketmq::conf::{ClientOption, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::MessageBuilder;
use rocketmq::{Producer, SimpleConsumer};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ok = match (args.get(1), args.get(2).map(String::as_str)) {
        (Some(addr), Some("send-receive")) => send_receive(addr, &args[3..]).await,
        _ => {
            eprintln!("usage: rokka-rmq5-rust <host:port> send-receive <topic> <group> <n>");
            Err("usage".into())
        }
    };
    if let Err(e) = ok {
        println!("compat: failed: {e}");
        std::process::exit(1);
    }
}

fn client_option(addr: &str) -> ClientOption {
    let mut c = ClientOption::default();
    c.set_access_url(addr);
    c.set_enable_tls(false);
    c.set_timeout(Duration::from_secs(10));
    c
}

async fn send_receive(addr: &str, args: &[String]) -> Result<(), String> {
    let (Some(topic), Some(group), Some(n)) = (args.first(), args.get(1), args.get(2)) else {
        return Err("send-receive <topic> <group> <n>".into());
    };
    let n: usize = n.parse().map_err(|e| format!("n: {e}"))?;
    let mut po = ProducerOption::default();
    po.set_topics(vec![topic.as_str()]);
    let mut producer = Producer::new(po, client_option(addr)).map_err(|e| format!("producer: {e:?}"))?;
    producer.start().await.map_err(|e| format!("producer start: {e:?}"))?;
    let mut sent = BTreeMap::new();
    for i in 0..n {
        let body = format!("rust5-{i}-é").into_bytes();
        let m = MessageBuilder::builder()
            .set_topic(topic.as_str())
            .set_tag(if i % 2 == 0 { "TagA" } else { "TagB" })
            .set_keys(vec![format!("key-{i}")])
            .set_body(body.clone())
            .build()
            .map_err(|e| format!("message: {e:?}"))?;
        let r = producer.send(m).await.map_err(|e| format!("send {i}: {e:?}"))?;
        if r.message_id().is_empty() {
            return Err(format!("send {i}: no message id"));
        }
        sent.insert(body, 0u32);
    }
    producer
        .shutdown()
        .await
        .map_err(|e| format!("producer shutdown: {e:?}"))?;

    let mut co = SimpleConsumerOption::default();
    co.set_topics(vec![topic.as_str()]);
    co.set_consumer_group(group.as_str());
    let mut consumer = SimpleConsumer::new(co, client_option(addr)).map_err(|e| format!("consumer: {e:?}"))?;
    consumer.start().await.map_err(|e| format!("consumer start: {e:?}"))?;
    let all = FilterExpression::new(FilterType::Tag, "*");
    let mut left_unacked: Option<Vec<u8>> = None;
    let mut redelivered = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (sent.values().any(|c| *c == 0) || !redelivered) && Instant::now() < deadline {
        let got = match consumer
            .receive_with(topic.as_str(), &all, 16, Duration::from_secs(2))
            .await
        {
            Ok(got) => got,
            // No message on the queue asked: try again.
            Err(_) => continue,
        };
        for m in got {
            let body = m.body().to_vec();
            println!(
                "compat: got {} {}",
                m.delivery_attempt(),
                String::from_utf8_lossy(&body)
            );
            let Some(count) = sent.get_mut(&body) else {
                return Err(format!("a body never sent: {body:?}"));
            };
            *count += 1;
            if left_unacked.is_none() {
                // The first one stays unacked: back after 2 s, attempt 2.
                left_unacked = Some(body);
                continue;
            }
            if left_unacked.as_ref() == Some(&body) {
                if m.delivery_attempt() != 2 {
                    return Err(format!("redelivered with attempt {}", m.delivery_attempt()));
                }
                redelivered = true;
            }
            consumer.ack(&m).await.map_err(|e| format!("ack: {e:?}"))?;
        }
    }
    consumer
        .shutdown()
        .await
        .map_err(|e| format!("consumer shutdown: {e:?}"))?;
    let missing: Vec<String> = sent
        .iter()
        .filter(|(_, c)| **c == 0)
        .map(|(b, _)| String::from_utf8_lossy(b).into_owned())
        .collect();
    if !missing.is_empty() {
        return Err(format!("not received: {missing:?}"));
    }
    let twice: Vec<String> = sent
        .iter()
        .filter(|(b, c)| **c > 1 && left_unacked.as_ref() != Some(*b))
        .map(|(b, _)| String::from_utf8_lossy(b).into_owned())
        .collect();
    if !twice.is_empty() || !redelivered {
        return Err(format!("delivered twice: {twice:?}; unacked one back: {redelivered}"));
    }
    println!("compat: {n} sent, received once each, the unacked one again with attempt 2");
    Ok(())
}
