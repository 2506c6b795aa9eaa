//! A copy's deadline is strict: an answer the broker reads once the deadline has passed is
//! a deadline failure, even when the watchdog thread that kills the copy is scheduled late.
//! Its own binary: the switches below are process-wide.

use std::sync::atomic::Ordering;
use std::time::Duration;

use germline_executor::broker::{LATE_ANSWERS_TAKEN_FOR_TESTS, WATCHDOG_LATE_MS_FOR_TESTS};
use germline_executor::runtime::RuntimeKind;
use germline_tests::sink::{Sink, SinkBehaviour};
use germline_tests::world::{request, World};
use serde_json::json;

/// The relay ends the request at the deadline with a 502, which this tool answers at once.
/// Its server takes half a second to start, so the broker's read of the answer (its
/// timeout counted from the request) outlasts the deadline by as much.
const ANSWERS_THE_502: &str = r#"
import asyncio, contextlib
@contextlib.asynccontextmanager
async def slow_start(app):
    await asyncio.sleep(0.5)
    yield {}
def create_server():
    m = FastMCP("x", lifespan=slow_start)
    @m.tool()
    def slow() -> str:
        return "%d %s" % get("http://slow.example/")
    return m
"#;

/// With the watchdog 1.5 s late: taking late answers (off) returns the tool's answer to the
/// relay's 502 as the call's result; counting them as over (on) fails the call by its
/// deadline.
#[test]
fn an_answer_read_after_the_deadline_is_a_deadline_failure() {
    WATCHDOG_LATE_MS_FOR_TESTS.store(1500, Ordering::SeqCst);
    for strict in [false, true] {
        LATE_ANSWERS_TAKEN_FOR_TESTS.store(!strict, Ordering::SeqCst);
        let w = World::new();
        let slow = Sink::start(SinkBehaviour::Slow { delay: Duration::from_secs(20) });
        let rel = w.release("late", "[tools.slow]\nhosts = [\"slow.example\"]\n", ANSWERS_THE_502);
        let policy = w.policy(
            &[("slow.example", &[], Some(slow.addr()))],
            &[("agent", &[])],
            "[limits]\ndeadline_ms = 2000\npool = 0\n",
        );
        let mut rt = w.start(RuntimeKind::Germline, &rel, policy).unwrap();
        let o = rt.call(&request("slow", json!({}), &[]));
        if strict {
            let err = o.error.clone().unwrap_or_default();
            assert!(err.contains("deadline of 2000 ms"), "strict: {o:?}");
        } else {
            assert!(o.error.is_none(), "late answers taken: {o:?}");
            assert!(o.result.as_ref().is_some_and(|r| r.to_string().contains("502")), "late answers taken: {o:?}");
        }
    }
}
