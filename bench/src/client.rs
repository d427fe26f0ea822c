//! The load: a fixed number of workers, each sending one request at a time on its own
//! keep-alive HTTP/1.1 connection (or on shared h2c connections, where every worker is
//! one in-flight stream, or on a gRPC stream of its own: `grpc`), for a fixed duration,
//! optionally paced to a fixed total rate.

use crate::grpc;
use crate::stats::{Answer, Record};
use crate::target::{dial, Target};
use crate::template::Template;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper::header::{HeaderName, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioExecutor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything the workers share.
pub struct Plan {
    pub targets: Vec<Target>,
    pub method: Method,
    pub headers: Vec<(HeaderName, Template)>,
    pub body: Option<Template>,
    /// With `grpc`: the body's lines, one check each, each rendered with its own number.
    pub checks: Vec<Template>,
    /// Requests in flight at any time (one per worker).
    pub concurrency: usize,
    /// Speak h2c, with every worker a stream on one of `connections` per target.
    pub h2: bool,
    /// Every worker a gRPC stream to the bridge (h2c, `connections` per target).
    pub grpc: bool,
    /// h2c connections per target the workers' streams are spread over.
    pub connections: usize,
    /// Requests per second across all workers; `None` sends as fast as answers come.
    pub rate: Option<f64>,
    /// Results before `measure_from` are discarded (warm-up); nothing is sent after `until`.
    pub measure_from: Instant,
    pub until: Instant,
    /// The run-wide request number that templates render (with `grpc`, check number).
    pub counter: AtomicU64,
}

/// One worker's way to send.
pub enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
    Grpc(Box<grpc::Stream>),
}

/// Opens an HTTP/1.1 or h2c connection to `target`.
pub async fn connect(target: &Target, h2: bool) -> Result<Conn, String> {
    let io = dial(target).await?;
    if h2 {
        let (sender, conn) = http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("h2 handshake {}: {e}", target.addr))?;
        tokio::spawn(conn);
        Ok(Conn::H2(sender))
    } else {
        let (sender, conn) = http1::handshake(io)
            .await
            .map_err(|e| format!("handshake {}: {e}", target.addr))?;
        tokio::spawn(conn);
        Ok(Conn::H1(sender))
    }
}

/// Sends requests until the plan's end; `index` spreads workers over targets and paces.
pub async fn worker(plan: Arc<Plan>, index: usize, mut conn: Conn) -> Record {
    let mut record = Record::default();
    let target = &plan.targets[index % plan.targets.len()];
    let interval = plan
        .rate
        .map(|r| Duration::from_secs_f64(plan.concurrency as f64 / r));
    let mut next = plan.rate.map(|r| {
        let start = plan.measure_from.min(Instant::now());
        start + Duration::from_secs_f64(index as f64 / r)
    });
    loop {
        if let (Some(at), Some(step)) = (next.as_mut(), interval) {
            tokio::time::sleep_until((*at).into()).await;
            *at += step;
        }
        let sent = Instant::now();
        if sent >= plan.until {
            break;
        }
        let outcome = match &mut conn {
            Conn::Grpc(stream) => exchange(&plan, stream).await,
            _ => {
                let n = plan.counter.fetch_add(1, Ordering::Relaxed);
                send(&plan, target, &mut conn, n).await
            }
        };
        let measured = sent >= plan.measure_from;
        match outcome {
            Ok(answer) if measured => {
                record.checks += answer.checks;
                record.failed_checks += answer.failed_checks;
                record.body_frames += answer.body_frames;
                if answer.failed_checks > 0 {
                    record.errors += 1;
                    if record.errors <= 3 {
                        let why = answer.failure.as_deref().unwrap_or("a check unanswered");
                        eprintln!("loadgen: worker {index}: failed check: {why}");
                    }
                } else {
                    record.latencies_ns.push(sent.elapsed().as_nanos() as u64);
                    *record.statuses.entry(answer.status).or_default() += 1;
                }
                let at = sent.duration_since(plan.measure_from).as_secs_f64();
                record.first_send.get_or_insert(at);
                record.last_send = Some(at);
            }
            Ok(_) => {}
            Err(e) => {
                if measured {
                    record.errors += 1;
                }
                if record.errors <= 3 {
                    eprintln!("loadgen: worker {index}: {e}");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                match &mut conn {
                    Conn::H1(_) => {
                        if let Ok(fresh) = connect(target, false).await {
                            conn = fresh;
                        }
                    }
                    Conn::Grpc(stream) => {
                        if let Err(e) = stream.reopen().await {
                            eprintln!("loadgen: worker {index}: reopening the stream: {e}");
                        }
                    }
                    Conn::H2(_) => {}
                }
            }
        }
    }
    if let Conn::Grpc(stream) = conn {
        stream.close().await;
    }
    record
}

/// One message on the worker's gRPC stream: the body's lines rendered with consecutive
/// check numbers, so that the checks of one batch name different keys.
async fn exchange(plan: &Plan, stream: &mut grpc::Stream) -> Result<Answer, String> {
    let lines = plan.checks.len() as u64;
    let first = plan.counter.fetch_add(lines, Ordering::Relaxed);
    let mut batch = String::new();
    for (n, line) in (first..).zip(&plan.checks) {
        batch.push_str(&line.render(n));
        batch.push('\n');
    }
    stream.exchange(&batch, lines).await
}

/// One request and its whole response, read frame by frame.
async fn send(plan: &Plan, target: &Target, conn: &mut Conn, n: u64) -> Result<Answer, String> {
    let uri = match conn {
        Conn::H2(_) => format!("http://{}{}", target.authority, target.path),
        _ => target.path.clone(),
    };
    let mut builder = Request::builder().method(plan.method.clone()).uri(uri);
    if let Conn::H1(_) = conn {
        builder = builder.header(HOST, target.authority.as_str());
    }
    for (name, value) in &plan.headers {
        builder = builder.header(name, value.render(n));
    }
    let body = plan
        .body
        .as_ref()
        .map_or_else(Bytes::new, |t| Bytes::from(t.render(n)));
    let request = builder
        .body(Full::new(body))
        .map_err(|e| format!("bad request: {e}"))?;
    let response = match conn {
        Conn::H1(sender) => {
            sender.ready().await.map_err(|e| format!("h1: {e}"))?;
            sender.send_request(request).await
        }
        Conn::H2(sender) => sender.send_request(request).await,
        Conn::Grpc(_) => return Err("a gRPC stream sends exchanges, not requests".into()),
    }
    .map_err(|e| format!("request: {e}"))?;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut body_frames = 0;
    while let Some(frame) = body.frame().await {
        if frame.map_err(|e| format!("body: {e}"))?.is_data() {
            body_frames += 1;
        }
    }
    Ok(Answer {
        status,
        checks: 0,
        failed_checks: 0,
        failure: None,
        body_frames,
    })
}
