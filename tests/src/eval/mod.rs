//! `germline-eval`: the attack corpus under every runtime, judged by the oracle.
//!
//! [`world`] generates one user's labelled world with fresh canaries per trial;
//! [`matrix`] runs each attack variant (`tests/attacks/`) under each runtime and counts
//! the trials in which a sink or consumer received something outside its clearance;
//! [`existence`] measures the existence-bit channel under lazy and declared splitting;
//! [`fcd`] runs formation-consistent dispatch against stock releases under every policy.

pub mod existence;
pub mod fcd;
pub mod matrix;
pub mod world;

pub use existence::{run_existence_bit, ExistenceReport};
pub use fcd::{run_fcd, FcdOptions, FcdReport};
pub use matrix::{run_matrix, Matrix, MatrixOptions, VARIANTS};
