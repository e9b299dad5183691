//! The JSON header decoder's cost per frame:
//! `cargo bench -p rokka-remoting --bench codec`.
//!
//! A SEND_MESSAGE frame rocketmq-client-rust 1.0.0 sent (the golden
//! capture tests/golden/rust_producer_oneway-req-10-json.hex: 14 extFields,
//! a 1 KiB-ish header) decoded by `rokka_remoting::decode` (one pass, the
//! fields straight into pairs) and by the way it was decoded before (the
//! header into a `serde_json::Value`, then its fields copied out of the
//! map). Prints ns per frame of each, best of 5 runs.

use std::hint::black_box;
use std::time::Instant;

use bytes::BytesMut;
use rokka_remoting::{decode, DEFAULT_MAX_FRAME};

#[path = "../tests/reference/mod.rs"]
mod reference;

const N: usize = 200_000;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

fn best_of_5(mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..N {
                f();
            }
            t.elapsed().as_nanos() as f64 / N as f64
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/rust_producer_oneway-req-10-json.hex"
    );
    let frame = match std::fs::read_to_string(path) {
        Ok(t) => hex(t.trim()),
        Err(e) => {
            eprintln!("{path}: {e}");
            return;
        }
    };
    let header_len = (u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]) & 0x00FF_FFFF) as usize;
    let header = &frame[8..8 + header_len];
    let one_pass = best_of_5(|| {
        let mut b = BytesMut::from(&frame[..]);
        black_box(decode(&mut b, DEFAULT_MAX_FRAME).ok().flatten());
    });
    let copy = best_of_5(|| {
        black_box(BytesMut::from(&frame[..]));
    });
    let value = best_of_5(|| {
        black_box(reference::reference_json(black_box(header)));
    });
    println!("header {header_len} bytes");
    println!("decode (one pass, whole frame)   {one_pass:7.0} ns/frame (of which {copy:.0} ns copying the frame in)");
    println!("decode (serde_json::Value, header) {value:7.0} ns/frame");
}
