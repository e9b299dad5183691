//! The remoting listener: one task reads frames off a connection and runs
//! each request as its own task (a client multiplexes many long-polling
//! pulls on one connection, so requests must not wait for each other); one
//! task writes responses and server-initiated requests in arrival order.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::codec::{decode, encode};
use crate::command::RemotingCommand;

/// What answers the requests of one port (the broker's or the name server's).
pub trait Service: Send + Sync + 'static {
    /// Handles one request; `None` for oneway requests.
    fn process(&self, cmd: RemotingCommand, conn: &Conn) -> impl Future<Output = Option<RemotingCommand>> + Send;
    /// Largest frame accepted on this port.
    fn max_frame_bytes(&self) -> usize;
    /// A connection closed (its clients or brokers are gone).
    fn connection_closed(&self, conn: &Conn);
    /// Whether `cmd` completes without waiting (then it runs on the reading
    /// task, in order, without a task of its own).
    fn inline(&self, _cmd: &RemotingCommand) -> bool {
        false
    }
}

/// A connection's outbound side, for responses and for requests the server
/// sends to the client (NOTIFY_CONSUMER_IDS_CHANGED).
#[derive(Debug, Clone)]
pub struct Conn {
    pub peer: SocketAddr,
    tx: mpsc::UnboundedSender<RemotingCommand>,
    next_opaque: Arc<AtomicI32>,
}

impl Conn {
    /// Queues a command for this connection; false when it is closed.
    pub fn send(&self, cmd: RemotingCommand) -> bool {
        self.tx.send(cmd).is_ok()
    }

    /// An opaque for a server-initiated request.
    pub fn next_opaque(&self) -> i32 {
        self.next_opaque.fetch_add(1, Ordering::Relaxed)
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Accepts connections until `shutdown` turns true.
pub async fn serve<S: Service>(listener: TcpListener, rmq: Arc<S>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let r = Arc::clone(&rmq);
                    let sd = shutdown.clone();
                    tokio::spawn(async move { run(stream, peer, r, sd).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

async fn run<S: Service>(stream: TcpStream, peer: SocketAddr, rmq: Arc<S>, mut shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    metrics::gauge!("rokka_rocketmq_connections").increment(1.0);
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<RemotingCommand>();
    let conn = Conn {
        peer,
        tx,
        next_opaque: Arc::new(AtomicI32::new(1)),
    };
    let writer = tokio::spawn(async move {
        let mut out = BytesMut::new();
        while let Some(cmd) = rx.recv().await {
            encode(&cmd, &mut out);
            // Gather whatever else is already queued into the same write.
            while let Ok(more) = rx.try_recv() {
                encode(&more, &mut out);
            }
            if wr.write_all(&out).await.is_err() {
                break;
            }
            out.clear();
        }
    });
    let max = rmq.max_frame_bytes();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    'conn: loop {
        loop {
            match decode(&mut buf, max) {
                Ok(Some(cmd)) => {
                    if cmd.is_response() {
                        // Answers to our NOTIFY / CHECK requests: nothing to do.
                        continue;
                    }
                    let serialize = match cmd.serialize_type {
                        crate::command::SerializeType::Json => "json",
                        crate::command::SerializeType::RocketMq => "rocketmq",
                    };
                    metrics::counter!("rokka_rocketmq_frames_total", "serialize" => serialize).increment(1);
                    if rmq.inline(&cmd) {
                        if let Some(resp) = rmq.process(cmd, &conn).await {
                            conn.send(resp);
                        }
                        continue;
                    }
                    let r = Arc::clone(&rmq);
                    let c = conn.clone();
                    tokio::spawn(async move {
                        if let Some(resp) = r.process(cmd, &c).await {
                            c.send(resp);
                        }
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "bad RocketMQ frame: closing connection");
                    break 'conn;
                }
            }
        }
        tokio::select! {
            n = rd.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            _ = shutdown.changed() => break,
        }
    }
    rmq.connection_closed(&conn);
    drop(conn);
    writer.abort();
    metrics::gauge!("rokka_rocketmq_connections").decrement(1.0);
}
