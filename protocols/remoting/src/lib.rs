//! RocketMQ remoting. The frame codec (`codec`, `command`;
//! `shared/protocols/rocketmq-remoting.md` §1) does no I/O: bytes in,
//! [`RemotingCommand`]s out, and back. `server` runs the listeners and
//! `processor` answers the name-server and broker requests.
//!
//! A frame is `length:u32 | headerWord:u32 | header | body`, where the top
//! byte of the header word is the serialize type (0 JSON, 1 ROCKETMQ binary)
//! and the low 24 bits the header length. Decoding is lenient where real
//! clients differ (numbers for strings, missing fields, unknown keys, a
//! trailing newline after the JSON header) and strict where a mistake would
//! misframe the stream (lengths).

pub mod auth;
mod clients;
mod codec;
pub mod codes;
mod command;
pub mod config;
pub mod namesrv;
pub mod processor;
pub mod registrar;
pub mod remote_offsets;
pub mod remote_txns;
pub mod server;
mod users;

pub use codec::{decode, encode, FrameError, DEFAULT_MAX_FRAME};

/// Largest Kafka commit metadata a forwarded offset commit may carry (the
/// Kafka listener's own `max_offset_metadata_bytes` is checked first, on
/// the coordinator; this bounds what any remoting client can store).
pub const MAX_FORWARDED_METADATA: usize = 64 * 1024;
pub use command::{ExtFields, LanguageCode, RemotingCommand, SerializeType, FLAG_ONEWAY, FLAG_RESPONSE};
pub use config::{RocketMqConfig, TlsMode};
pub use namesrv::NameServer;
pub use processor::RocketMq;
pub use server::{serve, serve_with, Service, Tls};
