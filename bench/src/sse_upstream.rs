//! `sse-upstream`: the bench's streaming upstream, to measure what metering costs on
//! streamed responses (bench/streams.py). Whatever the method and path, it answers 200
//! `text/event-stream` with the `CHUNKS` events of `events.rs`, the last but one carrying
//! the usage a metered rule settles on.
//!
//! Each event leaves in a write of its own, as an LLM server writes each event when it has
//! it: had hyper been handed all of them at once it would send them in one write, Envoy
//! would read them in one and the filter would see one body chunk instead of fifty. It
//! is otherwise as cheap as it can be, since it shares the bench's two cores with the
//! gateway it feeds: one thread (tokio current_thread), HTTP/1.1 keep-alive, the events'
//! bytes built once and shared by every response.
//!
//! Once listening it prints one JSON line, the port (the one the system picked with
//! `--port 0`) and what every response holds, so that the bench knows what the filter
//! must have metered:
//!
//! ```text
//! sse-upstream --port 0
//! {"chunks":50,"port":41234,"tokens":60}
//! ```

mod events;

use bytes::Bytes;
use clap::Parser;
use hyper::body::{Body, Frame};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Sleep;

/// A fast server-sent-events upstream for the ratelimit.wasm bench (loopback only).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Port on 127.0.0.1; 0 lets the system pick one (printed).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Milliseconds between a response's events (0: none), as a model's tokens come: each
    /// event then reaches the gateway on its own, and is a body chunk of its own there.
    #[arg(long, default_value_t = 0)]
    gap_ms: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sse-upstream: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args.port, Duration::from_millis(args.gap_ms))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sse-upstream: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(port: u16, gap: Duration) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let chunks: Arc<[Bytes]> = (0..events::CHUNKS)
        .map(|i| Bytes::from(events::chunk(i)))
        .collect();
    let tokens = events::PROMPT_TOKENS + events::COMPLETION_TOKENS;
    println!(
        "{}",
        json!({"port": port, "chunks": events::CHUNKS, "tokens": tokens})
    );
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: the connections already open keep being served.
                eprintln!("sse-upstream: accept: {e}");
                continue;
            }
        };
        // Small writes must leave at once, not wait for the previous one's ACK.
        if let Err(e) = stream.set_nodelay(true) {
            eprintln!("sse-upstream: nodelay: {e}");
        }
        let chunks = chunks.clone();
        let service = service_fn(move |_request| {
            let mut response = Response::new(Events {
                chunks: chunks.clone(),
                next: 0,
                paused: false,
                gap,
                sleep: None,
            });
            let event_stream = HeaderValue::from_static("text/event-stream");
            response.headers_mut().insert(CONTENT_TYPE, event_stream);
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(async move {
            let served = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                eprintln!("sse-upstream: connection: {e}");
            }
        });
    }
}

/// One response's body: the events, one frame each.
struct Events {
    chunks: Arc<[Bytes]>,
    next: usize,
    /// Whether the last poll gave a frame: the next one answers Pending, waking itself at
    /// once, and hyper flushes what it holds before polling again. Without it hyper would
    /// gather every frame ready into one write.
    paused: bool,
    /// The time between events, and the wait for the next one while it runs.
    gap: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(chunk) = self.chunks.get(self.next).cloned() else {
            return Poll::Ready(None);
        };
        if let Some(sleep) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        } else if self.paused {
            self.paused = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match self.gap.is_zero() {
            true => self.paused = true,
            false => self.sleep = Some(Box::pin(tokio::time::sleep(self.gap))),
        }
        self.next += 1;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.chunks.len()
    }
}
