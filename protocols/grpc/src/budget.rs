//! The gRPC listener's request bytes in memory, as the Kafka and RocketMQ
//! listeners' `max_inflight_request_bytes`: every request's DATA frames are
//! counted against one listener-wide budget as they arrive.
//!
//! HTTP/2 flow control does not bound this: the gRPC decoder buffers a
//! message until it is whole and hands the window back as it buffers, so
//! `max_connections × max_concurrent_streams × max_request_bytes` could be
//! held at once. Here a unary call (every method but Telemetry) holds its
//! bytes until it has been answered; a Telemetry stream holds a message's
//! bytes until that message is whole. A frame the budget has no room for
//! ends its call with RESOURCE_EXHAUSTED — refused, not waited for: calls
//! that each hold part of a message while waiting for room to read the rest
//! could wait on each other for good — and clients retry.
//! (`rokka_inflight_request_bytes{listener="grpc"}`,
//! `rokka_inflight_request_bytes_refused_total{listener="grpc"}`.)
//!
//! A request whose body is not complete `request_read_timeout_ms` after
//! its first byte (a Telemetry message: after the message's first byte)
//! ends DEADLINE_EXCEEDED, so a client that stops sending halfway does
//! not keep what it sent (`rokka_rocketmq5_request_read_timeouts_total`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use rokka_broker::limits::{ByteBudget, Reserved};
use tonic::codegen::{http, BoxFuture, Service};

/// The one client-streaming method: its messages are released one by one.
const TELEMETRY: &str = "/apache.rocketmq.v2.MessagingService/Telemetry";

/// Wraps the MessagingService: each request's body is counted.
#[derive(Clone)]
pub struct Budgeted<S> {
    inner: S,
    budget: ByteBudget,
    read_timeout: Duration,
}

impl<S> Budgeted<S> {
    pub fn new(inner: S, budget: ByteBudget, read_timeout: Duration) -> Budgeted<S> {
        Budgeted {
            inner,
            budget,
            read_timeout,
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Budgeted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<tonic::body::Body>> for Budgeted<S>
where
    S: Service<
            http::Request<Counted<tonic::body::Body>>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let streaming = req.uri().path() == TELEMETRY;
        let held = Arc::new(Held::default());
        let (parts, body) = req.into_parts();
        let body = Counted::new(
            body,
            self.budget.clone(),
            Arc::clone(&held),
            streaming,
            self.read_timeout,
        );
        let answer = self.inner.call(http::Request::from_parts(parts, body));
        Box::pin(async move {
            let response = answer.await;
            // A unary call's request bytes are held until it is answered
            // (its body, dropped after decoding, holds them as well).
            drop(held);
            response
        })
    }
}

/// The reservations of one request's bytes; returned when the last holder
/// (the body and the call) lets go, or at a streamed message's end.
#[derive(Default)]
pub struct Held(Mutex<Vec<Reserved>>);

impl Held {
    fn push(&self, r: Reserved) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(r);
    }

    fn release(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// Where a stream of gRPC messages (5-byte prefix: flag and big-endian
/// length, then the message) is between messages.
#[derive(Debug, Default, Clone, Copy)]
struct Framing {
    /// Prefix bytes read of the current message (5: the prefix is whole).
    prefix_read: usize,
    prefix: [u8; 5],
    /// Message bytes still to come after the prefix.
    left: u64,
}

impl Framing {
    /// Reads `data`; `Some(tail)` when a message ended in it: `tail` bytes
    /// of it follow the last message end (the start of the next message).
    fn feed(&mut self, mut data: &[u8]) -> Option<usize> {
        let mut tail = None;
        while !data.is_empty() {
            if self.prefix_read < 5 {
                let take = (5 - self.prefix_read).min(data.len());
                self.prefix[self.prefix_read..self.prefix_read + take].copy_from_slice(&data[..take]);
                self.prefix_read += take;
                data = &data[take..];
                if self.prefix_read == 5 {
                    let p = self.prefix;
                    self.left = u64::from(u32::from_be_bytes([p[1], p[2], p[3], p[4]]));
                    if self.left == 0 {
                        self.prefix_read = 0;
                        tail = Some(data.len());
                    }
                }
            } else {
                let take = (self.left.min(data.len() as u64)) as usize;
                self.left -= take as u64;
                data = &data[take..];
                if self.left == 0 {
                    self.prefix_read = 0;
                    tail = Some(data.len());
                }
            }
        }
        tail
    }
}

/// A request body whose DATA frames are counted against the budget.
pub struct Counted<B> {
    inner: B,
    budget: ByteBudget,
    held: Arc<Held>,
    /// Telemetry: released at message ends, and the read deadline runs
    /// per message.
    streaming: bool,
    framing: Framing,
    /// Bytes held now, and the KiB reserved for them (the budget counts
    /// KiB: what a frame adds is reserved by the KiB its bytes newly
    /// reach, so frames of a byte each cost their bytes, not a KiB each).
    held_bytes: usize,
    read_timeout: Duration,
    /// Armed at the first byte of the body (of a message, streaming).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Ended (refused or timed out): nothing more is read.
    failed: bool,
}

impl<B> Counted<B> {
    fn new(inner: B, budget: ByteBudget, held: Arc<Held>, streaming: bool, read_timeout: Duration) -> Counted<B> {
        Counted {
            inner,
            budget,
            held,
            streaming,
            framing: Framing::default(),
            held_bytes: 0,
            read_timeout,
            deadline: None,
            failed: false,
        }
    }

    /// Takes `n` more bytes into what the request holds, reserving the KiB
    /// they newly reach; false (nothing taken) if the budget has no room.
    fn hold(&mut self, n: usize) -> bool {
        let kib = |b: usize| b.div_ceil(1024);
        let more = kib(self.held_bytes + n) - kib(self.held_bytes);
        if more > 0 {
            match self.budget.try_reserve(more * 1024) {
                Some(r) => self.held.push(r),
                None => return false,
            }
        }
        self.held_bytes += n;
        true
    }

    fn fail(&mut self, status: tonic::Status) -> Poll<Option<Result<Frame<Bytes>, tonic::codegen::StdError>>> {
        self.failed = true;
        self.deadline = None;
        self.held_bytes = 0;
        self.held.release();
        Poll::Ready(Some(Err(Box::new(status))))
    }
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Some(data) = frame.data_ref() else {
                    return Poll::Ready(Some(Ok(frame)));
                };
                if data.is_empty() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                let len = data.len();
                if !this.hold(len) {
                    metrics::counter!("rokka_inflight_request_bytes_refused_total", "listener" => "grpc").increment(1);
                    return this.fail(tonic::Status::resource_exhausted(
                        "the broker holds its limit of request bytes (grpc.max_inflight_request_bytes): retry",
                    ));
                }
                if this.deadline.is_none() {
                    this.deadline = Some(Box::pin(tokio::time::sleep(this.read_timeout)));
                }
                if this.streaming {
                    if let Some(tail) = this.framing.feed(data) {
                        // Whole messages, handed to the decoder, are let go;
                        // what follows the last one's end starts the next,
                        // whose deadline starts now.
                        this.held.release();
                        this.held_bytes = 0;
                        this.deadline = None;
                        if tail > 0 {
                            if !this.hold(tail) {
                                metrics::counter!("rokka_inflight_request_bytes_refused_total", "listener" => "grpc")
                                    .increment(1);
                                return this.fail(tonic::Status::resource_exhausted(
                                    "the broker holds its limit of request bytes (grpc.max_inflight_request_bytes): retry",
                                ));
                            }
                            this.deadline = Some(Box::pin(tokio::time::sleep(this.read_timeout)));
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.deadline = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(d) = this.deadline.as_mut() {
                    if d.as_mut().poll(cx).is_ready() {
                        metrics::counter!("rokka_rocketmq5_request_read_timeouts_total").increment(1);
                        return this.fail(tonic::Status::deadline_exceeded(
                            "request not received within grpc.request_read_timeout_ms",
                        ));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    /// A body of the given frames, then pending for good.
    struct Frames(std::collections::VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.0.pop_front() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }

    fn msg(len: usize) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&(len as u32).to_be_bytes());
        v.extend(std::iter::repeat_n(7u8, len));
        v
    }

    async fn next<B: Body<Data = Bytes> + Unpin>(b: &mut Counted<B>) -> Option<Result<Frame<Bytes>, String>>
    where
        B::Error: Into<tonic::codegen::StdError>,
    {
        let polled = tokio::time::timeout(
            Duration::from_millis(300),
            poll_fn(|cx| Pin::new(&mut *b).poll_frame(cx)),
        )
        .await
        .ok()?;
        polled.map(|r| r.map_err(|e| e.to_string()))
    }

    #[test]
    fn framing_finds_message_ends_across_frames() {
        let mut f = Framing::default();
        let two = [msg(3), msg(0), msg(10)].concat();
        assert_eq!(f.feed(&two[..2]), None);
        assert_eq!(
            f.feed(&two[2..9]),
            Some(1),
            "the first ends at 8, one byte of the next follows"
        );
        assert_eq!(f.feed(&two[9..13]), Some(0), "the empty message ends at 13");
        assert_eq!(f.feed(&two[13..20]), None);
        assert_eq!(f.feed(&two[20..]), Some(0));
        assert_eq!(two.len(), 28);
    }

    #[tokio::test]
    async fn unary_bytes_are_held_until_the_call_lets_go_and_a_full_budget_refuses() {
        let budget = ByteBudget::new("test", 64 * 1024);
        let held = Arc::new(Held::default());
        let frames = Frames(vec![Bytes::from(vec![1u8; 40 * 1024])].into());
        let mut a = Counted::new(
            frames,
            budget.clone(),
            Arc::clone(&held),
            false,
            Duration::from_secs(30),
        );
        assert!(matches!(next(&mut a).await, Some(Ok(_))));
        assert_eq!(budget.available_kib(), 24);
        // A second call's 40 KiB find no room: refused, and it holds nothing.
        let held_b = Arc::new(Held::default());
        let frames = Frames(vec![Bytes::from(vec![1u8; 40 * 1024])].into());
        let mut b = Counted::new(
            frames,
            budget.clone(),
            Arc::clone(&held_b),
            false,
            Duration::from_secs(30),
        );
        let refused = next(&mut b).await;
        assert!(
            matches!(&refused, Some(Err(e)) if e.contains("max_inflight_request_bytes")),
            "{refused:?}"
        );
        assert!(next(&mut b).await.is_none(), "a refused body ends");
        assert_eq!(budget.available_kib(), 24);
        // The first call's body is dropped (decoded) but the call holds on.
        drop(a);
        assert_eq!(budget.available_kib(), 24);
        drop(held);
        assert_eq!(budget.available_kib(), 64);
    }

    #[tokio::test]
    async fn telemetry_releases_each_whole_message() {
        let budget = ByteBudget::new("test", 1024 * 1024);
        let held = Arc::new(Held::default());
        let stream = [msg(5000), msg(3000)].concat();
        let frames = Frames(
            vec![
                Bytes::copy_from_slice(&stream[..4000]),
                Bytes::copy_from_slice(&stream[4000..5005]),
                Bytes::copy_from_slice(&stream[5005..6000]),
            ]
            .into(),
        );
        let mut t = Counted::new(frames, budget.clone(), Arc::clone(&held), true, Duration::from_secs(30));
        assert!(matches!(next(&mut t).await, Some(Ok(_))));
        assert_eq!(budget.available_kib(), 1024 - 4, "part of a message is held");
        assert!(matches!(next(&mut t).await, Some(Ok(_))));
        assert_eq!(budget.available_kib(), 1024, "a whole message is let go");
        assert!(matches!(next(&mut t).await, Some(Ok(_))));
        assert_eq!(budget.available_kib(), 1024 - 1);
    }

    #[tokio::test]
    async fn a_frame_across_a_message_end_lets_the_message_go_and_keeps_the_rest() {
        let budget = ByteBudget::new("test", 1024 * 1024);
        let held = Arc::new(Held::default());
        let stream = [msg(5000), msg(3000)].concat();
        let frames = Frames(
            vec![
                Bytes::copy_from_slice(&stream[..4000]),
                // The first message's end and 2 000 bytes of the second.
                Bytes::copy_from_slice(&stream[4000..7005]),
                Bytes::copy_from_slice(&stream[7005..]),
            ]
            .into(),
        );
        let mut t = Counted::new(frames, budget.clone(), Arc::clone(&held), true, Duration::from_secs(30));
        assert!(matches!(next(&mut t).await, Some(Ok(_))));
        assert_eq!(budget.available_kib(), 1024 - 4);
        assert!(matches!(next(&mut t).await, Some(Ok(_))));
        assert_eq!(
            budget.available_kib(),
            1024 - 2,
            "only the second message's 2 000 bytes are held"
        );
        assert!(matches!(next(&mut t).await, Some(Ok(_))));
        assert_eq!(budget.available_kib(), 1024);
    }

    #[tokio::test]
    async fn frames_of_a_byte_each_cost_their_bytes() {
        let budget = ByteBudget::new("test", 64 * 1024);
        let held = Arc::new(Held::default());
        let frames = Frames((0..10_000).map(|_| Bytes::from_static(b"x")).collect());
        let mut a = Counted::new(
            frames,
            budget.clone(),
            Arc::clone(&held),
            false,
            Duration::from_secs(30),
        );
        for _ in 0..10_000 {
            assert!(matches!(next(&mut a).await, Some(Ok(_))));
        }
        assert_eq!(budget.available_kib(), 64 - 10, "10 000 bytes hold 10 KiB, not 10 000");
        drop(a);
        drop(held);
        assert_eq!(budget.available_kib(), 64);
    }

    #[tokio::test]
    async fn a_body_that_stops_halfway_ends_at_its_read_deadline() {
        let budget = ByteBudget::new("test", 1024 * 1024);
        let held = Arc::new(Held::default());
        let frames = Frames(vec![Bytes::from(vec![0u8; 2048])].into());
        let mut a = Counted::new(
            frames,
            budget.clone(),
            Arc::clone(&held),
            false,
            Duration::from_millis(50),
        );
        assert!(matches!(next(&mut a).await, Some(Ok(_))));
        assert_eq!(budget.available_kib(), 1022);
        let ended = next(&mut a).await;
        assert!(
            matches!(&ended, Some(Err(e)) if e.contains("request_read_timeout_ms")),
            "{ended:?}"
        );
        assert_eq!(budget.available_kib(), 1024, "what it sent is let go");
    }
}
