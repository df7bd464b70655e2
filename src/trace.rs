//! The step trace (`log.trace_steps`): spans recorded from every thread of a rank — the
//! training loop's phases, each gradient bucket's all-reduce on the communication thread, each
//! batch's decode on the loader workers — while a trace is on, then written in the format
//! PyTorch's profiler writes (Kineto's Chrome trace-event JSON with its `distributedInfo`),
//! which Perfetto, chrome://tracing and Holistic Trace Analysis open.
//!
//! Recording is off almost always: a span costs one relaxed atomic load then. While on, spans
//! go into one list behind a mutex (a few hundred per step, so contention is negligible), up
//! to [`MAX_EVENTS`]; later ones are counted and left out, so a trace's size is bounded
//! whatever `trace_steps` asks.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// The most spans one rank's trace keeps: about 150 bytes each in the file, so a trace stays
/// under about 15 MB per rank.
pub const MAX_EVENTS: usize = 100_000;

/// Kineto's category of the spans a program annotates (`record_function`): HTA and Perfetto
/// show them as CPU annotations on their thread.
pub const USER_ANNOTATION: &str = "user_annotation";
/// Kineto's category of CPU operators; the bucket all-reduces and batch decodes use it.
pub const CPU_OP: &str = "cpu_op";

static RECORDING: AtomicBool = AtomicBool::new(false);
static RECORDER: Mutex<Recorder> = Mutex::new(Recorder::new());

/// One recorded span.
#[derive(Debug, Clone)]
struct Span {
    name: Cow<'static, str>,
    category: &'static str,
    thread: u64,
    start: Instant,
    duration: Duration,
    args: Option<Value>,
}

struct Recorder {
    /// When recording started, as a monotonic instant and as Unix time: spans are written in
    /// Unix microseconds, so the ranks' traces line up (to the nodes' clock agreement).
    origin: Option<(Instant, Duration)>,
    spans: Vec<Span>,
    /// Thread id to thread name, of every thread that recorded a span.
    threads: BTreeMap<u64, String>,
    dropped: u64,
}

impl Recorder {
    const fn new() -> Recorder {
        Recorder { origin: None, spans: Vec::new(), threads: BTreeMap::new(), dropped: 0 }
    }
}

fn recorder() -> MutexGuard<'static, Recorder> {
    // A panic while holding the lock leaves the spans valid: keep using them.
    RECORDER.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether spans are being recorded now.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Starts recording (anything recorded before is dropped).
pub fn start() {
    let mut recorder = recorder();
    let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    *recorder = Recorder::new();
    recorder.origin = Some((Instant::now(), unix));
    RECORDING.store(true, Ordering::Relaxed);
}

/// Stops recording and returns what was recorded.
pub fn stop() -> Trace {
    RECORDING.store(false, Ordering::Relaxed);
    let mut recorder = recorder();
    let taken = std::mem::replace(&mut *recorder, Recorder::new());
    Trace { origin: taken.origin, spans: taken.spans, threads: taken.threads, dropped: taken.dropped }
}

/// Records a span of the calling thread from `start` to `end`, when recording.
pub fn span(
    name: impl Into<Cow<'static, str>>,
    category: &'static str,
    start: Instant,
    end: Instant,
    args: Option<Value>,
) {
    if !recording() {
        return;
    }
    let thread = thread_id();
    let mut recorder = recorder();
    if recorder.spans.len() >= MAX_EVENTS {
        recorder.dropped += 1;
        return;
    }
    recorder
        .threads
        .entry(thread)
        .or_insert_with(|| std::thread::current().name().unwrap_or("thread").to_string());
    let duration = end.saturating_duration_since(start);
    recorder.spans.push(Span { name: name.into(), category, thread, start, duration, args });
}

/// The kernel's id of the calling thread, as Kineto names threads.
fn thread_id() -> u64 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    u64::try_from(tid).unwrap_or(0)
}

/// A finished recording of one rank.
pub struct Trace {
    origin: Option<(Instant, Duration)>,
    spans: Vec<Span>,
    threads: BTreeMap<u64, String>,
    /// Spans left out past [`MAX_EVENTS`].
    pub dropped: u64,
}

/// Who wrote a trace: Kineto's `distributedInfo` and the process's name.
pub struct TraceSource<'a> {
    pub rank: usize,
    pub world_size: usize,
    pub node: &'a str,
    /// The communication library, as Kineto's `backend` ("mpi", "nccl").
    pub backend: &'a str,
}

impl Trace {
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The trace as the JSON document PyTorch's profiler writes (`*.pt.trace.json`): complete
    /// events (`"ph": "X"`) with Unix-microsecond `ts` and `dur`, the threads' names as
    /// metadata events, and `distributedInfo` for the rank.
    pub fn kineto_json(&self, source: &TraceSource<'_>) -> Value {
        let pid = std::process::id();
        let (origin, unix) = self.origin.unwrap_or((Instant::now(), Duration::ZERO));
        let micros = |d: Duration| d.as_nanos() as f64 / 1e3;
        let mut events = Vec::with_capacity(self.spans.len() + self.threads.len() + 1);
        events.push(json!({
            "ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": format!("rtrain rank {} on {}", source.rank, source.node)}
        }));
        for (tid, name) in &self.threads {
            events.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}),
            );
        }
        for span in &self.spans {
            let since = span.start.saturating_duration_since(origin);
            let mut event = json!({
                "ph": "X",
                "cat": span.category,
                "name": span.name,
                "pid": pid,
                "tid": span.thread,
                "ts": micros(unix + since),
                "dur": micros(span.duration),
            });
            if let Some(args) = &span.args {
                event["args"] = args.clone();
            }
            events.push(event);
        }
        json!({
            "schemaVersion": 1,
            "distributedInfo": {"backend": source.backend, "rank": source.rank, "world_size": source.world_size},
            "deviceProperties": [],
            "traceName": format!("rtrain rank {}", source.rank),
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 0,
            "traceEvents": events,
        })
    }
}

impl Trace {
    /// [`Self::kineto_json`] as the file's bytes: compact, but with `distributedInfo` first and
    /// spaced as PyTorch writes it, since Holistic Trace Analysis finds a file's rank with the
    /// pattern `"rank":\s+(\d+)` and takes the first match.
    pub fn kineto_bytes(&self, source: &TraceSource<'_>) -> Vec<u8> {
        let mut doc = self.kineto_json(source);
        if let Some(fields) = doc.as_object_mut() {
            fields.remove("distributedInfo");
        }
        let rest = serde_json::to_string(&doc).unwrap_or_else(|_| "{}".to_string());
        let backend = Value::from(source.backend);
        format!(
            "{{\"distributedInfo\": {{\"backend\": {backend}, \"rank\": {}, \"world_size\": {}}}, {}",
            source.rank,
            source.world_size,
            rest.strip_prefix('{').unwrap_or("}")
        )
        .into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the recorder is global to the process.
    #[test]
    fn records_only_while_on_and_writes_kineto_events() {
        let t0 = Instant::now();
        span("before", USER_ANNOTATION, t0, t0 + Duration::from_millis(1), None);
        start();
        let begin = Instant::now();
        span("forward", USER_ANNOTATION, begin, begin + Duration::from_micros(1500), None);
        std::thread::Builder::new()
            .name("rtrain-allreduce".into())
            .spawn(move || {
                span(
                    "all-reduce bucket 0",
                    CPU_OP,
                    begin,
                    begin + Duration::from_micros(250),
                    Some(json!({"bytes": 4096})),
                )
            })
            .unwrap()
            .join()
            .unwrap();
        let trace = stop();
        span("after", USER_ANNOTATION, t0, t0, None);
        assert_eq!(trace.len(), 2);
        let source = TraceSource { rank: 1, world_size: 2, node: "c1", backend: "mpi" };
        let doc = trace.kineto_json(&source);
        assert_eq!(doc["distributedInfo"]["rank"], 1);
        assert_eq!(doc["distributedInfo"]["world_size"], 2);
        let events = doc["traceEvents"].as_array().unwrap();
        let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), 2);
        assert_eq!(complete[0]["name"], "forward");
        assert!((complete[0]["dur"].as_f64().unwrap() - 1500.0).abs() < 1e-6);
        assert_eq!(complete[1]["args"]["bytes"], 4096);
        assert_ne!(complete[0]["tid"], complete[1]["tid"]);
        // Unix microseconds, the same clock on every rank.
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as f64;
        assert!((now_us - complete[0]["ts"].as_f64().unwrap()).abs() < 60e6);
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"rtrain-allreduce"), "{names:?}");
        let bytes = trace.kineto_bytes(&source);
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.starts_with(r#"{"distributedInfo": {"backend": "mpi", "rank": 1, "world_size": 2}, "#),
            "{text}"
        );
        let reread: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reread, doc);
    }
}
