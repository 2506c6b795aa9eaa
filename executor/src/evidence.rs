//! Evidence of a trigger, and replay of a copy from it (DESIGN §2, "Evidence").
//!
//! When a copy's requests to a host diverge from the record of the group that serves it,
//! the broker keeps what a third party needs to re-run both sides: the serving copy's
//! inputs (metadata, twin inputs, slot, the replies it received) and the names, labels
//! and hashes of the items of both views. Item contents are never stored: a replay is
//! given them, and checks them against the hashes.
//!
//! # What is published, and what is only opened (DESIGN §5, §6)
//!
//! The full record ([`TriggerEvidence`]) is item-derived: the request digests, replies,
//! slot and item hashes are all things a copy that held an item chose, so a copy that
//! sends one request per byte of an item turns published digests into a dictionary
//! oracle (256 guesses per byte). The full record is therefore never published. It is
//! the *opening*, kept by the witness holder (mode 0600 beside the witness) and given to
//! a verifier together with the items. What is published ([`PublicEvidence`]) is:
//!
//! - the release hash and the tool name (call metadata the agent chose, bounded);
//! - how many items the call had and how many copies its plan ran (metadata: Plan
//!   decides them from labels and clearances, never from what a copy did);
//! - an HMAC-SHA256 commitment to the full record, keyed by a fresh 256-bit secret per
//!   trigger that only the opening holds. Without the secret the commitment is a
//!   pseudorandom string: it says nothing about the record, and no guess about an item
//!   can be checked against it.
//!
//! The rule: *published evidence has a fixed shape whose every field is either call
//! metadata or keyed by a per-trigger secret; nothing a copy sent, received or wrote is
//! published, hashed or not, and no count or choice a copy made is published.* One call
//! publishes at most one witness (the heaviest verdict among its triggers, see the
//! verifier) and at most one trigger-log line. The bits a release can still choose per
//! call are whether the call yields a witness and, if so, which of the three verdict
//! classes it carries (item witness, state divergence, unverified or declared-broken):
//! at most log2(4) = 2 bits per call, the same bits the dampening events already carry.
//! The trigger's host, kind and position, the request counts and the per-try outcomes
//! stay in the opening.

use std::collections::BTreeMap;

use base64::Engine;
use germline_model::{HostName, ItemName, Label, ReleaseHash, RequestDigest, TriggerKind};
use ring::hmac;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ExecutorError;

/// Twin inputs: fixed per call without looking at item contents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TwinInputs {
    /// Frozen wall clock (seconds since the epoch).
    pub clock: f64,
    /// Seed for every RNG the shim controls (hex).
    pub seed: String,
}

impl TwinInputs {
    /// Fresh twin inputs for one call.
    pub fn fresh() -> Result<TwinInputs, ExecutorError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| ExecutorError::Sandbox(format!("getrandom: {e}")))?;
        let clock =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        Ok(TwinInputs { clock, seed: hex::encode(seed) })
    }
}

/// Version of the evidence encoding (2: published evidence is a commitment).
pub const EVIDENCE_VERSION: u32 = 2;

/// Domain separation of the evidence commitment.
const EVIDENCE_DOMAIN: &[u8] = b"germline-evidence v2\n";
/// Domain of the keyed commitment that stands for a sealed tool name.
const TOOL_DOMAIN: &[u8] = b"germline-evidence tool\n";

/// Longest tool name published as is; longer or unusual names are published by hash.
const MAX_PUBLIC_TOOL_NAME: usize = 128;

/// One item as evidence names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemRecord {
    /// The item's name (a file path, or `arg:NAME`).
    pub name: ItemName,
    /// Its label under the deployer's policy.
    pub label: Label,
    /// SHA-256 of its contents (hex), so supplied contents can be checked.
    pub sha256: String,
}

/// The deployment a trigger's copies ran in, as far as release code can see it and
/// germline does not make it the same everywhere itself (the root's host name, time zone
/// and unset limits are): the host's configuration, which `germline verify` starts its
/// germline with, and the machine, which it compares with its own. So a third party
/// replays in what the call ran in, or says where it could not (SECURITY.md, "What a
/// third party's re-check reproduces").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// The policy's `[environment]`.
    pub environment: BTreeMap<String, String>,
    /// Every item rule's data root (each is an empty directory in the root).
    pub data_roots: Vec<std::path::PathBuf>,
    /// `[limits]`: memory per copy in bytes.
    pub memory_bytes: u64,
    /// `[limits]`: processes per copy.
    pub processes: u64,
    /// `[limits]`: CPU seconds per copy process.
    pub cpu_seconds: u64,
    /// `[limits]`: the deadline in milliseconds.
    pub deadline_ms: u64,
    /// `[limits]`: the largest message.
    pub max_message_bytes: usize,
    /// `[limits]`: ready copies per germline.
    pub pool: usize,
    /// `[limits]`: how copies are made, unless the manifest says.
    pub copy_source: crate::manifest::CopySourceKind,
    /// `[sandbox]`: whether the root was resident.
    pub resident_root: bool,
    /// Whether the germline made its heap immortal (`GERMLINE_IMMORTAL_HEAP`).
    pub immortal_heap: bool,
    /// `[startup_items]`: the path the deployment gave each of the manifest's item
    /// placeholders (a path is configuration; what lies there is an item, which a
    /// verifier is given like the others).
    #[serde(default)]
    pub startup_items: BTreeMap<String, String>,
    /// The device of the in-memory tree the call's root was bound from (a resident root):
    /// a replay's tree never gets it ([`crate::resident::avoid_device`]), so a request that
    /// carries it replays otherwise at the host and at a third party alike. None from a
    /// host that did not record it, or a root that was not resident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_device: Option<u64>,
    /// The machine.
    pub machine: Machine,
}

/// What a copy sees of the machine that no configuration sets: a replay elsewhere may see
/// other values, and then a verdict it does not reproduce says nothing about the host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// `uname`'s system, release, version and machine (not the node name: the germline's
    /// own is fixed).
    pub kernel: String,
    /// The CPUs the broker, and so every copy, may run on (`sched_getaffinity`).
    pub cpus: Vec<usize>,
    /// The interpreter every copy runs (its path is what `sys.executable` says).
    pub runtime: std::path::PathBuf,
    /// The CPU, as `cpuid` tells any process: vendor, family, model, stepping and model
    /// name of the broker's first CPU in `/proc/cpuinfo`. Empty from a host that did not
    /// record it (then it is no excuse).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cpu: String,
    /// That CPU's feature flags (`/proc/cpuinfo`'s `flags`), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_flags: Vec<String>,
    /// The system's address-space randomization (`kernel.randomize_va_space`; germline
    /// undoes only a process's own opt-out).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address_randomization: String,
    /// Fixed limits the broker could not give its germlines because its own hard limits
    /// are lower (a broker that is not root; [`crate::confine::clamped_fixed_limits`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamped_limits: Vec<String>,
}

impl Machine {
    /// This process's machine, with `runtime` the interpreter.
    pub fn here(runtime: &std::path::Path) -> Machine {
        let (cpu, cpu_flags) = std::fs::read_to_string("/proc/cpuinfo").map(|t| cpu(&t)).unwrap_or_default();
        let address_randomization = std::fs::read_to_string("/proc/sys/kernel/randomize_va_space")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        Machine {
            kernel: kernel(),
            cpus: cpus(),
            runtime: runtime.to_path_buf(),
            cpu,
            cpu_flags,
            address_randomization,
            clamped_limits: crate::confine::clamped_fixed_limits(),
        }
    }

    /// Where `other` (the replaying machine) differs from this one, each said in words.
    pub fn differences(&self, other: &Machine) -> Vec<String> {
        let mut out = Vec::new();
        if self.kernel != other.kernel {
            out.push(format!("kernel: recorded {:?}, here {:?}", self.kernel, other.kernel));
        }
        if self.cpus != other.cpus {
            out.push(format!("CPUs: recorded {:?}, here {:?}", self.cpus, other.cpus));
        }
        if self.runtime != other.runtime {
            out.push(format!("runtime: recorded {}, here {}", self.runtime.display(), other.runtime.display()));
        }
        if !self.address_randomization.is_empty() && self.address_randomization != other.address_randomization {
            out.push(format!(
                "address randomization (kernel.randomize_va_space): recorded {}, here {}",
                self.address_randomization, other.address_randomization
            ));
        }
        if self.clamped_limits != other.clamped_limits {
            out.push(format!(
                "limits below the fixed ones: recorded {:?}, here {:?}",
                self.clamped_limits, other.clamped_limits
            ));
        }
        if !self.cpu.is_empty() && self.cpu != other.cpu {
            out.push(format!("CPU: recorded {:?}, here {:?}", self.cpu, other.cpu));
        }
        if !self.cpu_flags.is_empty() && self.cpu_flags != other.cpu_flags {
            let only = |a: &[String], b: &[String]| {
                let mut d: Vec<&str> = a.iter().filter(|f| !b.contains(f)).map(String::as_str).collect();
                let more = d.len().saturating_sub(MAX_FLAGS_SAID);
                d.truncate(MAX_FLAGS_SAID);
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                format!("[{}]{more}", d.join(" "))
            };
            out.push(format!(
                "CPU flags: recorded only {}, here only {}",
                only(&self.cpu_flags, &other.cpu_flags),
                only(&other.cpu_flags, &self.cpu_flags)
            ));
        }
        out
    }
}

/// Most CPU flags a difference names on each side.
const MAX_FLAGS_SAID: usize = 12;

/// The first CPU of `/proc/cpuinfo` text: its identity (vendor, family/model/stepping,
/// model name) and its sorted flags. A field the architecture does not have is left out.
fn cpu(info: &str) -> (String, Vec<String>) {
    let first = info.split("\n\n").next().unwrap_or("");
    let field = |k: &str| {
        first.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            (name.trim() == k).then(|| value.trim().to_owned())
        })
    };
    let ids =
        ["vendor_id", "cpu family", "model", "stepping", "model name", "CPU implementer", "CPU part", "CPU variant"];
    let identity: Vec<String> = ids.iter().filter_map(|k| field(k).map(|v| format!("{k}={v}"))).collect();
    let mut flags: Vec<String> = field("flags")
        .or_else(|| field("Features"))
        .map(|f| f.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    flags.sort();
    flags.dedup();
    (identity.join(", "), flags)
}

fn kernel() -> String {
    // SAFETY: uname fills a zeroed struct it is given; every field is NUL-terminated.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a local utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    [field(&u.sysname), field(&u.release), field(&u.version), field(&u.machine)].join(" ")
}

fn cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a local cpu_set_t with its size.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads the set within its size.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Everything needed to replay the serving copy of a trigger with either view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TriggerEvidence {
    /// Encoding version.
    pub version: u32,
    /// The release.
    pub release: ReleaseHash,
    /// The tool called.
    pub tool: String,
    /// Public metadata: arguments with every labelled argument blanked.
    pub arguments: Map<String, Value>,
    /// The destination whose record diverged.
    pub host: HostName,
    /// How it diverged.
    pub kind: TriggerKind,
    /// Position of the first divergence.
    pub position: usize,
    /// Items of the serving copy's view.
    pub serving_view: Vec<ItemName>,
    /// Items of the triggering copy's view (a superset).
    pub trigger_view: Vec<ItemName>,
    /// Every item of the call: name, label, hash.
    pub items: Vec<ItemRecord>,
    /// Twin inputs of the call.
    pub twin: TwinInputs,
    /// The serving copy's slot (values) and its label.
    pub slot: Map<String, Value>,
    /// Label of that slot.
    pub slot_label: Label,
    /// The serving group's transcript: every reply its copy received, per host (base64).
    pub replies: BTreeMap<HostName, Vec<String>>,
    /// The serving copy's requests to `host` (the record).
    pub serving_requests: Vec<RequestDigest>,
    /// The triggering copy's requests to `host`.
    pub trigger_requests: Vec<RequestDigest>,
    /// How many copies the call's plan ran.
    pub copies: usize,
    /// The per-trigger secret keying the commitment (64 hex digits). Not covered by the
    /// commitment itself; present only in the opening.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// The release's tools were listed by a copy holding start-up data, so `tool` may be a
    /// name that copy chose: it is published only as a keyed commitment
    /// ([`PublicEvidence::tool`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_sealed: bool,
    /// The deployment the copies ran in; absent from openings of hosts before it was
    /// recorded (then `germline verify` can place only the items' own directories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<Deployment>,
}

/// What is published of a trigger: call metadata and a keyed commitment (module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublicEvidence {
    /// Encoding version.
    pub version: u32,
    /// The release.
    pub release: ReleaseHash,
    /// The tool called, or `sha256:<hex>` of its name when that is not a short plain name,
    /// or `hmac:<hex>` (keyed by the trigger's secret, so only an opening shows it) when
    /// the release's tool list was made from start-up data and its names are that data's.
    pub tool: String,
    /// How many items the call had.
    pub items: u32,
    /// How many copies the call's plan ran.
    pub copies: u32,
    /// HMAC-SHA256 (hex) of the full record under its per-trigger secret.
    pub commitment: String,
    /// The full record in the clear: only with commitments switched off (the "mechanism
    /// off" twin tests use to show what publishing it discloses). Never set otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disclosed: Option<Box<TriggerEvidence>>,
}

/// A fresh 256-bit secret for one trigger's commitments (hex).
pub fn fresh_secret() -> Result<String, ExecutorError> {
    let mut k = [0u8; 32];
    getrandom::fill(&mut k).map_err(|e| ExecutorError::Sandbox(format!("getrandom: {e}")))?;
    Ok(hex::encode(k))
}

fn secret_key(secret_hex: &str) -> Result<hmac::Key, ExecutorError> {
    let mut k = [0u8; 32];
    hex::decode_to_slice(secret_hex, &mut k)
        .map_err(|_| ExecutorError::Call("evidence secret is not 64 hex digits".into()))?;
    Ok(hmac::Key::new(hmac::HMAC_SHA256, &k))
}

/// HMAC-SHA256 (hex) of `domain || bytes` under the hex secret.
pub fn keyed_commitment(secret_hex: &str, domain: &[u8], bytes: &[u8]) -> Result<String, ExecutorError> {
    let key = secret_key(secret_hex)?;
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(domain);
    ctx.update(bytes);
    Ok(hex::encode(ctx.sign().as_ref()))
}

/// Checks (in constant time) that `commitment` is the HMAC of `domain || bytes`.
pub fn check_keyed_commitment(
    secret_hex: &str,
    domain: &[u8],
    bytes: &[u8],
    commitment: &str,
) -> Result<(), ExecutorError> {
    let key = secret_key(secret_hex)?;
    let tag = hex::decode(commitment).map_err(|_| ExecutorError::Call("commitment is not hex".into()))?;
    let mut msg = domain.to_vec();
    msg.extend_from_slice(bytes);
    hmac::verify(&key, &msg, &tag).map_err(|_| ExecutorError::Call("the opening does not match the commitment".into()))
}

/// The tool name as published: as is when short and plain (MCP's tool-name alphabet),
/// else by hash, so a release cannot make its witnesses large through a long name.
pub fn public_tool_name(tool: &str) -> String {
    let plain = !tool.is_empty()
        && tool.len() <= MAX_PUBLIC_TOOL_NAME
        && tool.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'));
    if plain {
        tool.to_owned()
    } else {
        use sha2::{Digest, Sha256};
        format!("sha256:{}", hex::encode(Sha256::digest(tool.as_bytes())))
    }
}

impl TriggerEvidence {
    /// The bytes the commitment covers: the record's JSON without its secret.
    fn committed_bytes(&self) -> Result<Vec<u8>, ExecutorError> {
        let mut bare = self.clone();
        bare.secret.clear();
        serde_json::to_vec(&bare).map_err(|e| ExecutorError::Call(format!("encoding evidence: {e}")))
    }

    /// What is published of this record. `commitments` off (tests only) publishes the
    /// record itself beside the commitment.
    pub fn public(&self, commitments: bool) -> Result<PublicEvidence, ExecutorError> {
        let commitment = keyed_commitment(&self.secret, EVIDENCE_DOMAIN, &self.committed_bytes()?)?;
        let disclosed = if commitments {
            None
        } else {
            let mut clear = self.clone();
            clear.secret.clear();
            Some(Box::new(clear))
        };
        Ok(PublicEvidence {
            version: EVIDENCE_VERSION,
            release: self.release,
            tool: if self.tool_sealed {
                format!("hmac:{}", keyed_commitment(&self.secret, TOOL_DOMAIN, self.tool.as_bytes())?)
            } else {
                public_tool_name(&self.tool)
            },
            items: u32::try_from(self.items.len()).unwrap_or(u32::MAX),
            copies: u32::try_from(self.copies).unwrap_or(u32::MAX),
            commitment,
            disclosed,
        })
    }

    /// Checks that this record (an opening) is the one `public` commits to.
    pub fn opens(&self, public: &PublicEvidence) -> Result<(), ExecutorError> {
        if self.version != EVIDENCE_VERSION || public.version != EVIDENCE_VERSION {
            return Err(ExecutorError::Call("unsupported evidence version".into()));
        }
        check_keyed_commitment(&self.secret, EVIDENCE_DOMAIN, &self.committed_bytes()?, &public.commitment)?;
        let ours = self.public(public.disclosed.is_none())?;
        if ours.release != public.release
            || ours.tool != public.tool
            || ours.items != public.items
            || ours.copies != public.copies
        {
            return Err(ExecutorError::Call("the opening does not match the published evidence".into()));
        }
        Ok(())
    }

    /// Decoded transcript replies.
    pub fn decoded_replies(&self) -> Result<BTreeMap<HostName, Vec<Vec<u8>>>, ExecutorError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        self.replies
            .iter()
            .map(|(h, rs)| {
                let decoded = rs
                    .iter()
                    .map(|r| b64.decode(r).map_err(|e| ExecutorError::Call(format!("evidence reply for {h}: {e}"))))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((h.clone(), decoded))
            })
            .collect()
    }

    /// Checks supplied item contents against the recorded hashes; every item of
    /// `view` must be supplied.
    pub fn check_items(&self, view: &[ItemName], contents: &BTreeMap<ItemName, Vec<u8>>) -> Result<(), ExecutorError> {
        use sha2::{Digest, Sha256};
        for name in view {
            let rec = self
                .items
                .iter()
                .find(|i| &i.name == name)
                .ok_or_else(|| ExecutorError::Call(format!("view item {name} is not named in the evidence")))?;
            let bytes =
                contents.get(name).ok_or_else(|| ExecutorError::Call(format!("item {name} was not supplied")))?;
            let got = hex::encode(Sha256::digest(bytes));
            if got != rec.sha256 {
                return Err(ExecutorError::Call(format!("item {name} does not match its recorded hash")));
            }
        }
        Ok(())
    }
}

/// Encodes reply bytes for evidence.
pub fn encode_replies(replies: &BTreeMap<HostName, Vec<Vec<u8>>>) -> BTreeMap<HostName, Vec<String>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    replies.iter().map(|(h, rs)| (h.clone(), rs.iter().map(|r| b64.encode(r)).collect())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use germline_model::TriggerKind;

    #[test]
    fn the_machine_names_its_cpu_and_says_where_another_differs() {
        let info = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n\
                    model name\t: Intel Xeon\nstepping\t: 7\nflags\t\t: sse2 avx2 fpu avx512f\n\n\
                    processor\t: 1\nvendor_id\t: Other\nflags\t\t: none\n";
        let (id, flags) = cpu(info);
        assert_eq!(id, "vendor_id=GenuineIntel, cpu family=6, model=85, stepping=7, model name=Intel Xeon");
        assert_eq!(flags, ["avx2", "avx512f", "fpu", "sse2"]);
        let here = Machine::here(std::path::Path::new("/usr/bin/python3"));
        if std::path::Path::new("/proc/cpuinfo").exists() {
            assert!(!here.cpu.is_empty() && !here.cpu_flags.is_empty(), "{here:?}");
        }
        assert!(here.differences(&here.clone()).is_empty());
        let other = Machine { cpu: id.clone(), cpu_flags: flags.clone(), ..here.clone() };
        let said = here.differences(&other).join("; ");
        assert!(said.contains("CPU: recorded") && said.contains("Intel Xeon"), "{said}");
        let fewer = Machine { cpu_flags: vec!["avx2".into(), "fpu".into(), "sse2".into()], ..other.clone() };
        assert_eq!(other.differences(&fewer), ["CPU flags: recorded only [avx512f], here only []"]);
        // A host that did not record its CPU gets no excuse from it.
        let unrecorded = Machine {
            cpu: String::new(),
            cpu_flags: Vec::new(),
            address_randomization: String::new(),
            clamped_limits: Vec::new(),
            ..here.clone()
        };
        assert!(unrecorded.differences(&Machine { clamped_limits: Vec::new(), ..other.clone() }).is_empty());
        let no_aslr = Machine { address_randomization: "0".into(), ..here.clone() };
        assert!(no_aslr.differences(&Machine { address_randomization: "2".into(), ..here.clone() })[0]
            .contains("randomize_va_space"));
        let clamped = Machine { clamped_limits: vec!["stack=4194304".into()], ..here.clone() };
        assert!(clamped.differences(&Machine { clamped_limits: Vec::new(), ..here.clone() })[0].contains("stack="));
        let json = serde_json::to_string(&unrecorded).unwrap();
        assert!(
            ["cpu\"", "cpu_flags", "address_randomization", "clamped_limits"].iter().all(|f| !json.contains(f)),
            "an older opening encodes as before: {json}"
        );
    }

    fn evidence(tool: &str, tool_sealed: bool) -> TriggerEvidence {
        TriggerEvidence {
            version: EVIDENCE_VERSION,
            release: ReleaseHash::of_bytes(b"r"),
            tool: tool.into(),
            arguments: Map::new(),
            host: HostName::new("ocr.example").unwrap_or_else(|e| panic!("{e}")),
            kind: TriggerKind::Extra,
            position: 0,
            serving_view: vec![],
            trigger_view: vec![],
            items: vec![],
            twin: TwinInputs { clock: 0.0, seed: "00".into() },
            slot: Map::new(),
            slot_label: Label::empty(),
            replies: BTreeMap::new(),
            serving_requests: vec![],
            trigger_requests: vec![],
            copies: 2,
            secret: fresh_secret().unwrap_or_else(|e| panic!("{e}")),
            tool_sealed,
            deployment: None,
        }
    }

    #[test]
    fn a_tool_name_from_a_labelled_list_is_published_only_as_a_keyed_commitment() {
        // Off (a data-free list): the name as is, or by unkeyed hash, which a reader who
        // guesses the name can check.
        let plain = evidence("GLC-hr-5a17c0ffee", false).public(true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain.tool, "GLC-hr-5a17c0ffee");
        let long = "x".repeat(200);
        assert_eq!(evidence(&long, false).public(true).unwrap_or_else(|e| panic!("{e}")).tool, public_tool_name(&long));
        // On: a keyed commitment; two triggers of the same tool publish unrelated values.
        let a = evidence("GLC-hr-5a17c0ffee", true);
        let public = a.public(true).unwrap_or_else(|e| panic!("{e}"));
        assert!(public.tool.starts_with("hmac:") && !public.tool.contains("GLC"), "{}", public.tool);
        let text = serde_json::to_string(&public).unwrap_or_default();
        assert!(!text.contains("GLC-hr") && !text.contains(&public_tool_name("GLC-hr-5a17c0ffee")[7..]), "{text}");
        let b = evidence("GLC-hr-5a17c0ffee", true).public(true).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(public.tool, b.tool);
        // The opening checks it; an opening that unseals the name (flag cleared) does not.
        a.opens(&public).unwrap_or_else(|e| panic!("{e}"));
        let mut unsealed = a.clone();
        unsealed.tool_sealed = false;
        assert!(unsealed.opens(&public).is_err());
        let mut other = a.clone();
        other.tool = "lookup".into();
        assert!(other.opens(&public).is_err());
    }
}
