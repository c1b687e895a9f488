//! `trident plan`: the layout request from the flags (`plan::request`), the ranked layouts
//! (`plan::plan`), printed as a table or as JSON (`plan::report`).

use super::flags;
use crate::error::Result;
use crate::flags::PLAN_FLAGS;
use crate::plan::{self, report, Request};

/// `trident plan`: rank tensor/pipeline/data-parallel layouts for a model on N GPUs.
pub fn run(rest: &[String]) -> Result<()> {
    let Some(a) =
        flags("plan", "choose a TP/PP/DP layout: memory per GPU and iteration time of each", PLAN_FLAGS, rest)?
    else {
        return Ok(());
    };
    let req = Request::from_args(&a)?;
    let top = a.usize("--top")?.unwrap_or(5);
    let result = plan::plan(&req)?;
    if a.has("--json") {
        print!("{}", report::json_lines(&result, &req, top));
    } else {
        print!("{}", report::text(&result, &req, top));
    }
    Ok(())
}
