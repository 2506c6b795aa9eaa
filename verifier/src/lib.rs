//! Verifier: probe and control replay of a trigger, online after a call and offline
//! from a witness record, classifying what dampening weighs.
