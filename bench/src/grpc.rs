//! `--grpc`: the load a fleet of gateway workers puts on the bridge. Each worker is one
//! long-lived gRPC bidi stream (`POST /ratelimit.v1.Bridge/Check`, h2c), as a filter
//! worker holds one; it sends one message (an exchange: the protocol crate's envelope
//! around a batch of checks), waits for the reply with the same exchange id, and repeats.
//!
//! Only gRPC's framing is spoken (a 5-byte prefix per message, `grpc-status` in the
//! trailers), as the bridge does. The bench talks to the bridge over the wire only, so it
//! frames messages itself rather than link the bridge's server code.

use crate::stats::Answer;
use crate::target::{dial, Target};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2;
use hyper::header::{HeaderName, CONTENT_TYPE, TE};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioExecutor;
use ratelimit_protocol::{
    prefixed, split_message, stream_message, Deframer, GRPC_METHOD, GRPC_SERVICE,
};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// The request body of a stream: the worker's messages, as it hands them over.
pub struct Outgoing(mpsc::Receiver<Bytes>);

impl Body for Outgoing {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A connection that carries streams (cloned by every worker on it).
pub type Connection = http2::SendRequest<Outgoing>;

/// Opens an h2c connection to `target` for streams.
pub async fn connect(target: &Target) -> Result<Connection, String> {
    let (sender, conn) = http2::handshake(TokioExecutor::new(), dial(target).await?)
        .await
        .map_err(|e| format!("h2 handshake {}: {e}", target.addr))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One worker's stream: open until an error or the end of the run.
pub struct Stream {
    connection: Connection,
    target: Target,
    /// Headers of the stream's request besides gRPC's own (`--header`, rendered once).
    headers: Vec<(HeaderName, String)>,
    messages: mpsc::Sender<Bytes>,
    replies: Incoming,
    deframer: Deframer,
    next_id: u32,
}

impl Stream {
    /// Opens a stream on `connection` (or, if that connection is gone, on a new one).
    pub async fn open(
        mut connection: Connection,
        target: &Target,
        headers: Vec<(HeaderName, String)>,
    ) -> Result<Stream, String> {
        if connection.is_closed() {
            connection = connect(target).await?;
        }
        let (messages, rx) = mpsc::channel(4);
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!(
                "http://{}/{GRPC_SERVICE}/{GRPC_METHOD}",
                target.authority
            ))
            .header(CONTENT_TYPE, "application/grpc")
            .header(TE, "trailers");
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        let request = request
            .body(Outgoing(rx))
            .map_err(|e| format!("bad stream request: {e}"))?;
        let response = connection
            .send_request(request)
            .await
            .map_err(|e| format!("stream: {e}"))?;
        if response.status() != StatusCode::OK {
            return Err(format!("stream refused: HTTP {}", response.status()));
        }
        Ok(Stream {
            connection,
            target: target.clone(),
            headers,
            messages,
            replies: response.into_body(),
            deframer: Deframer::default(),
            next_id: 0,
        })
    }

    /// A fresh stream in place of this one, after an error.
    pub async fn reopen(&mut self) -> Result<(), String> {
        let fresh = Stream::open(
            self.connection.clone(),
            &self.target,
            std::mem::take(&mut self.headers),
        )
        .await?;
        *self = fresh;
        Ok(())
    }

    /// Sends `batch` (`checks` lines) as one exchange and waits for its reply.
    pub async fn exchange(&mut self, batch: &str, checks: u64) -> Result<Answer, String> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let message = Bytes::from(prefixed(stream_message(id, batch).as_bytes()));
        self.messages
            .send(message)
            .await
            .map_err(|_| "stream closed".to_string())?;
        loop {
            let reply = self.next_reply().await?;
            match split_message(&reply) {
                Some((got, answer)) if got == id => return tally(answer, checks),
                Some(_) => continue, // an older exchange's reply, if one was given up
                None => return Err("reply without an exchange id".into()),
            }
        }
    }

    /// The next reply message, or why the stream ended.
    async fn next_reply(&mut self) -> Result<Vec<u8>, String> {
        loop {
            if let Some(message) = self.deframer.next_message()? {
                return Ok(message);
            }
            let frame = match self.replies.frame().await {
                None => return Err("stream ended without trailers".into()),
                Some(Err(e)) => return Err(format!("stream: {e}")),
                Some(Ok(frame)) => frame,
            };
            match frame.into_data() {
                Ok(data) => self.deframer.push(&data),
                Err(frame) => return Err(ended(frame.into_trailers().ok())),
            }
        }
    }

    /// Ends the stream as a gateway does (its side closed, the trailers read), within a
    /// second.
    pub async fn close(self) {
        let Stream {
            messages,
            mut replies,
            ..
        } = self;
        drop(messages);
        let _ = tokio::time::timeout(Duration::from_secs(1), async move {
            while let Some(Ok(_)) = replies.frame().await {}
        })
        .await;
    }
}

/// Why a stream ended, from its trailers.
fn ended(trailers: Option<hyper::HeaderMap>) -> String {
    let field = |name: &str| {
        trailers
            .as_ref()
            .and_then(|t| t.get(name))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    format!(
        "stream ended: grpc-status {} {}",
        field("grpc-status"),
        field("grpc-message")
    )
    .trim_end()
    .to_string()
}

/// Counts the answered and failed checks of a reply to `checks` checks: a line starting
/// `!` (the bridge could not run the check) or `?` (it would not) is a failed check, and
/// so is a check the reply has no line for.
fn tally(reply: &[u8], checks: u64) -> Result<Answer, String> {
    let (mut answered, mut failed, mut failure) = (0u64, 0u64, None);
    for line in reply.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        match line[0] {
            b'!' | b'?' => {
                failed += 1;
                failure.get_or_insert_with(|| String::from_utf8_lossy(line).into_owned());
            }
            _ => answered += 1,
        }
    }
    if answered + failed > checks {
        return Err(format!(
            "{} reply lines to {checks} checks",
            answered + failed
        ));
    }
    Ok(Answer {
        status: 200,
        checks: answered,
        failed_checks: checks - answered,
        failure,
        body_frames: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_and_missing_lines_are_failed_checks() {
        let ok = tally(b"1767225600000 1,99,600,0 1,49999,1,0\n", 1).unwrap();
        assert_eq!((ok.checks, ok.failed_checks), (1, 0));
        let mixed = tally(b"1 1,1,1,0\n! redis unavailable\n? key outside\n", 3).unwrap();
        assert_eq!((mixed.checks, mixed.failed_checks), (1, 2));
        assert_eq!(mixed.failure.as_deref(), Some("! redis unavailable"));
        let short = tally(b"1 1,1,1,0\n", 2).unwrap();
        assert_eq!((short.checks, short.failed_checks), (1, 1));
        assert!(tally(b"1 1,1,1,0\n1 1,1,1,0\n", 1).is_err());
    }

    #[test]
    fn trailers_say_why_a_stream_ended() {
        let mut t = hyper::HeaderMap::new();
        t.insert("grpc-status", "14".parse().unwrap());
        t.insert("grpc-message", "bridge shutting down".parse().unwrap());
        assert_eq!(
            ended(Some(t)),
            "stream ended: grpc-status 14 bridge shutting down"
        );
        assert_eq!(ended(None), "stream ended: grpc-status");
    }
}
