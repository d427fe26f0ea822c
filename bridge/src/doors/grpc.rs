//! The stream transport: `POST /ratelimit.v1.Bridge/Check`, one long-lived gRPC bidi
//! stream per gateway worker. A message on an open stream costs the gateway far less than a
//! new HTTP callout (no new async-client stream, no header maps), which is why it is the
//! filter's default.
//!
//! Only gRPC's framing is spoken here (a 5-byte prefix per message, `grpc-status` in the
//! trailers); the messages are the protocol crate's text envelopes, so neither side needs
//! protobuf. Messages are answered concurrently, each as soon as its checks are done; the
//! id in the envelope pairs a reply with its exchange.
//!
//! A stream may idle as long as its gateway likes between messages, but a message that has
//! begun must be complete within the body timeout: a gateway sends each one at once, so a
//! message that trickles in is a stalled or hostile peer holding the stream's buffer.

use crate::doors::guards::budget::{Charge, Share};
use crate::doors::guards::deadlines::{Activity, Unwritten};
use crate::doors::wire;
use crate::engine::Engine;
use crate::ops::labels::{Failure, Transport};
use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use ratelimit_protocol::{prefixed, split_message, stream_message, Deframer};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Messages of one stream checked at the same time; past it the bridge stops reading the
/// stream and HTTP/2 flow control makes the gateway wait.
const MAX_CONCURRENT_MESSAGES: usize = 64;
/// Replies of one stream made and waiting for the connection to take them; past it the
/// answers wait (and hold their messages' permits).
pub const REPLIES_QUEUED: usize = 16;

/// gRPC status codes used here and by the rate limit service (`rls`).
pub const OK: u32 = 0;
pub const INVALID_ARGUMENT: u32 = 3;
pub const DEADLINE_EXCEEDED: u32 = 4;
pub const UNAVAILABLE: u32 = 14;

/// The trailers that end a call with `status` (and `message`, if any and sendable).
pub fn trailers(status: u32, message: &str) -> Frame<Bytes> {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", HeaderValue::from(status));
    if let Ok(value) = HeaderValue::from_str(message) {
        if !message.is_empty() {
            map.insert("grpc-message", value);
        }
    }
    Frame::trailers(map)
}

/// What a reply holds until the connection takes it: its exchange's share of the budget,
/// and its place under the write deadline.
pub type Holding = (Option<Charge>, Option<Unwritten>);

/// What one stream is served with.
pub struct Serving {
    /// What runs the stream's exchanges.
    pub engine: Engine,
    /// The connection's share of the budget.
    pub share: Share,
    /// The connection's: a reply waits under its write deadline.
    pub activity: Activity,
    pub stop: watch::Receiver<bool>,
    /// Longest a message may take to arrive once begun.
    pub message_timeout: Duration,
}

/// Serves one stream: reads messages from `body` until the gateway closes its side (or
/// `stop` turns true, or a message takes longer than `message_timeout` to arrive), answers
/// each on `out`, then ends with the trailers. Each message is charged against the budget
/// before it is answered, and its reply waits under the write deadline once made.
pub async fn serve(
    serving: Serving,
    mut body: Incoming,
    out: mpsc::Sender<(Frame<Bytes>, Holding)>,
) {
    let Serving {
        engine,
        share,
        activity,
        stop: mut shutdown,
        message_timeout,
    } = serving;
    let _open = engine.store().metrics().stream_opened();
    let mut deframer = Deframer::default();
    let mut answering = JoinSet::new();
    let permits = Arc::new(Semaphore::new(MAX_CONCURRENT_MESSAGES));
    // When the message now partway in must be complete.
    let mut due: Option<Instant> = None;
    // One future for the whole stream, polled wherever the loop waits: made anew per frame,
    // its registration with the watch was a noticeable share of a message's cost.
    let stopping = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    }
    .fuse();
    let mut stopping = std::pin::pin!(stopping);
    let (status, why) = 'read: loop {
        let overdue = async move {
            match due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        let frame = tokio::select! {
            frame = body.frame() => frame,
            () = &mut stopping => break (UNAVAILABLE, "bridge shutting down".into()),
            () = overdue => break (
                DEADLINE_EXCEEDED,
                format!("a message did not arrive whole within {message_timeout:?}"),
            ),
        };
        let data = match frame {
            None => break (OK, String::new()),
            Some(Err(e)) => break (UNAVAILABLE, format!("connection lost: {e}")),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue, // the gateway's trailers: nothing to answer
            },
        };
        deframer.push(&data);
        let mut completed = false;
        loop {
            let message = match deframer.next_message() {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(e) => break 'read (INVALID_ARGUMENT, e),
            };
            completed = true;
            let Some((id, _)) = split_message(&message) else {
                break 'read (INVALID_ARGUMENT, "message without an exchange id".into());
            };
            let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
                break 'read (UNAVAILABLE, "bridge shutting down".into());
            };
            let charge = tokio::select! {
                charge = share.charge(message.len()) => charge,
                () = &mut stopping => None,
            };
            let Some(charge) = charge else {
                break 'read (UNAVAILABLE, "bridge shutting down".into());
            };
            // A finished answer stays in the set until joined: reap them as the stream
            // goes, or a long-lived stream keeps every answer it ever gave (about 900
            // bytes each, as `make soak` found).
            while answering.try_join_next().is_some() {}
            let (engine, out, activity) = (engine.clone(), out.clone(), activity.clone());
            answering.spawn(async move {
                let reply = answer(&engine, id, &message).await;
                drop(message);
                let holding = (Some(charge), Some(activity.unwritten()));
                let _ = out
                    .send((
                        Frame::data(Bytes::from(prefixed(reply.as_bytes()))),
                        holding,
                    ))
                    .await;
                drop(permit);
            });
        }
        due = match (deframer.is_partway(), due) {
            (false, _) => None,
            (true, Some(due)) if !completed => Some(due),
            (true, _) => Some(Instant::now() + message_timeout),
        };
    };
    // Every message read is answered before the stream ends.
    while answering.join_next().await.is_some() {}
    match status {
        INVALID_ARGUMENT => engine.store().metrics().failure(Failure::BadMessage),
        DEADLINE_EXCEEDED => engine.store().metrics().failure(Failure::MessageTimeout),
        _ => {}
    }
    match status {
        OK => {}
        // The gateway went away (restart, scale-in): nothing to act on.
        UNAVAILABLE => log::info!("gRPC stream ended: {why}"),
        _ => log::warn!("gRPC stream ended: {why}"),
    }
    let _ = out
        .send((trailers(status, &why), (None, Some(activity.unwritten()))))
        .await;
}

/// The reply message to exchange `id`; a batch that cannot be read at all is answered with
/// one failed line, which the filter cannot match to its checks and so fails the exchange.
async fn answer(engine: &Engine, id: u32, message: &[u8]) -> String {
    let body = split_message(message).map_or(&[][..], |(_, body)| body);
    let mut reply = String::new();
    if let Err(bad) = wire::answer(engine, Transport::Grpc, body, &mut reply).await {
        log::warn!("exchange {id} refused: {bad}");
        reply = format!("! {bad}\n");
    }
    stream_message(id, &reply)
}
