//! `report --scaling`'s projection to more ranks than were measured: each rank's own work per
//! step stays what the smallest run measured (the per-rank batch is fixed), and the gradient
//! all-reduce is a ring's, `2 (n - 1) / n x gradient bytes / link bandwidth`, of which the
//! part that backward hides is taken away. What the model assumes is printed with it, and its
//! error is shown by projecting the largest measured run from the smaller ones.

use serde::Serialize;

use super::scaling::ScalingRow;
use crate::plot::StackedBar;

/// What the projection starts from, and where each figure came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProjectionInputs {
    /// The run the per-rank work comes from (the smallest), and its step and own work per step.
    pub base_world_size: usize,
    pub base_step: f64,
    pub compute: f64,
    /// Its backward pass per step, the window communication can hide in.
    pub backward: f64,
    pub gradient_bytes: u64,
    /// Bytes per second through the ring's slowest link, and where the figure came from.
    pub bandwidth: f64,
    pub bandwidth_from: String,
    /// The share of backward that hides communication, and where it came from.
    pub hidden: f64,
    pub hidden_from: String,
    pub ranks_per_node: usize,
}

/// One projected world size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Projected {
    pub world_size: usize,
    pub nodes: usize,
    /// The ring all-reduce per step, the part of it not hidden, the step, and the efficiency
    /// against the base run.
    pub allreduce: f64,
    pub exposed: f64,
    pub step: f64,
    pub efficiency: f64,
}

/// The projection and its check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Projection {
    pub inputs: ProjectionInputs,
    /// 2x, 4x and 8x the largest measured world size.
    pub projected: Vec<Projected>,
    /// The largest measured run projected from the smaller runs alone: its projected and
    /// measured efficiency (None with fewer than two runs, or no bandwidth to project with).
    pub check: Option<(Projected, f64)>,
}

/// A ring all-reduce's seconds for `bytes` over `ranks` ranks at `bandwidth` bytes/s.
pub fn ring_seconds(ranks: usize, bytes: u64, bandwidth: f64) -> f64 {
    if ranks <= 1 || bandwidth <= 0.0 {
        return 0.0;
    }
    let n = ranks as f64;
    2.0 * (n - 1.0) / n * bytes as f64 / bandwidth
}

impl ProjectionInputs {
    /// The inputs from `rows` (sorted by world size, with breakdowns): the work from the first,
    /// the bandwidth from `link_gbit` or else from the largest run with several ranks, the
    /// hidden share from that run too (else none: nothing measured says backward hides any).
    pub fn from_rows(rows: &[ScalingRow], link_gbit: Option<f64>) -> Option<ProjectionInputs> {
        let base = rows.first()?;
        let base_breakdown = base.breakdown.as_ref()?;
        let largest = rows.last()?;
        // Runs that record no gradient bytes (another framework's, or an older rtrain's) give
        // nothing to put on the wire: no projection, rather than one of free communication.
        let gradient_bytes = rows.iter().map(|r| r.gradient_bytes).max().filter(|&bytes| bytes > 0)?;
        let multi = rows.iter().rev().find(|r| r.world_size > 1 && r.breakdown.is_some());
        let (bandwidth, bandwidth_from) = match (link_gbit, multi) {
            (Some(gbit), _) => (gbit * 1e9 / 8.0, format!("the link, {gbit} Gbit/s (--link-gbit)")),
            (None, Some(run)) => {
                let measured = run.breakdown.as_ref()?.allreduce;
                let bytes_through = ring_seconds(run.world_size, gradient_bytes, 1.0);
                (
                    bytes_through / measured.max(1e-12),
                    format!("measured in the {}-rank run's all-reduces", run.world_size),
                )
            }
            (None, None) => return None,
        };
        let (hidden, hidden_from) = match multi.and_then(|r| r.breakdown.as_ref().map(|b| (r, b))) {
            Some((run, b)) => {
                let hidden = ((b.allreduce - b.exposed_comm) / b.backward_or_tiny()).clamp(0.0, 1.0);
                (hidden, format!("measured in the {}-rank run", run.world_size))
            }
            None => (0.0, "none assumed (no run with several ranks measured it)".to_string()),
        };
        Some(ProjectionInputs {
            base_world_size: base.world_size,
            base_step: base_breakdown.step,
            compute: base_breakdown.busy,
            backward: base_breakdown.phase("backward"),
            gradient_bytes,
            bandwidth,
            bandwidth_from,
            hidden,
            hidden_from,
            ranks_per_node: (largest.world_size / largest.nodes.max(1)).max(1),
        })
    }

    /// The step at `world_size` ranks.
    pub fn project(&self, world_size: usize) -> Projected {
        let allreduce = ring_seconds(world_size, self.gradient_bytes, self.bandwidth);
        let exposed = (allreduce - self.hidden * self.backward).max(0.0);
        let step = self.compute + exposed;
        Projected {
            world_size,
            nodes: world_size.div_ceil(self.ranks_per_node),
            allreduce,
            exposed,
            step,
            efficiency: self.base_step / step.max(1e-12),
        }
    }
}

impl super::scaling::Breakdown {
    fn backward_or_tiny(&self) -> f64 {
        self.phase("backward").max(1e-12)
    }
}

/// The projection to 2x, 4x and 8x the largest run of `rows`, and the check of the largest run
/// projected from the others. None without breakdowns, gradient bytes or a bandwidth to use.
pub fn project(rows: &[ScalingRow], link_gbit: Option<f64>) -> Option<Projection> {
    let inputs = ProjectionInputs::from_rows(rows, link_gbit)?;
    let largest = rows.last()?;
    let projected = [2, 4, 8].iter().map(|k| inputs.project(k * largest.world_size)).collect();
    let check = match rows.len() {
        0 | 1 => None,
        n => ProjectionInputs::from_rows(&rows[..n - 1], link_gbit)
            .map(|smaller| (smaller.project(largest.world_size), largest.efficiency)),
    };
    Some(Projection { inputs, projected, check })
}

/// The projected world sizes as stacked bars beside the measured ones: their work and their
/// exposed communication.
pub fn bars(projection: &Projection) -> Vec<StackedBar> {
    let work = projection.inputs.compute;
    projection
        .projected
        .iter()
        .map(|p| StackedBar {
            label: format!("{} (proj.)", p.world_size),
            segments: vec![("work (projected)".to_string(), work), ("comm_wait".to_string(), p.exposed)],
        })
        .collect()
}

/// The projection as text: its assumptions, the projected sizes, and the check.
pub fn describe(projection: &Projection) -> String {
    let i = &projection.inputs;
    let mut out = format!(
        "Projection (ring all-reduce model): step(n) = work + max(0, 2(n-1)/n x {:.1} MB / {:.1} MB/s - {:.0}% of backward {:.4} s)\n\
         Assumes: each rank's work per step stays the {}-rank run's {:.4} s (fixed per-rank batch, no straggler); \
         bandwidth {}; backward hides communication: {}; {} rank(s) per node; latency ignored.\n",
        i.gradient_bytes as f64 / 1e6,
        i.bandwidth / 1e6,
        100.0 * i.hidden,
        i.backward,
        i.base_world_size,
        i.compute,
        i.bandwidth_from,
        i.hidden_from,
        i.ranks_per_node,
    );
    out.push_str("| ranks | nodes | all-reduce (s) | exposed (s) | step (s) | efficiency |\n|------:|------:|------:|------:|------:|------:|\n");
    for p in &projection.projected {
        out.push_str(&format!(
            "| {} | {} | {:.4} | {:.4} | {:.4} | {:.0}% |\n",
            p.world_size,
            p.nodes,
            p.allreduce,
            p.exposed,
            p.step,
            100.0 * p.efficiency
        ));
    }
    match &projection.check {
        Some((p, measured)) => out.push_str(&format!(
            "Check: the {}-rank run projected from the smaller runs: {:.0}% against {:.0}% measured ({:+.1} points).\n",
            p.world_size,
            100.0 * p.efficiency,
            100.0 * measured,
            100.0 * (p.efficiency - measured)
        )),
        None => out.push_str("Check: needs two runs or more and a bandwidth for the smaller ones (--link-gbit).\n"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_cost_and_hidden_share() {
        // 46.8 MB over a 1 Gbit/s ring of 2: each rank sends and receives the gradient once.
        assert!((ring_seconds(2, 46_800_000, 125e6) - 0.3744).abs() < 1e-9);
        assert!((ring_seconds(8, 8_000_000, 1e6) - 14.0).abs() < 1e-9);
        assert_eq!(ring_seconds(1, 1_000_000, 1e6), 0.0);
        let inputs = ProjectionInputs {
            base_world_size: 1,
            base_step: 1.0,
            compute: 1.0,
            backward: 0.5,
            gradient_bytes: 50_000_000,
            bandwidth: 100e6,
            bandwidth_from: String::new(),
            hidden: 0.5,
            hidden_from: String::new(),
            ranks_per_node: 1,
        };
        // 2 ranks: 0.5 s of all-reduce, 0.25 s hidden behind backward.
        let two = inputs.project(2);
        assert!((two.allreduce - 0.5).abs() < 1e-12 && (two.exposed - 0.25).abs() < 1e-12);
        assert!((two.efficiency - 0.8).abs() < 1e-12);
        assert_eq!(inputs.project(8).nodes, 8);
    }
}
