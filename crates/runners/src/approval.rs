//! `human_approval` levels: the request, with its schema and deadline.

use crate::*;

impl Attempt {
    pub(super) fn approval(&self) -> Vec<NewEvent> {
        let level = &self.scenario.levels[self.level];
        let LevelKind::HumanApproval { prompt, approver_role, output_schema } = &level.kind else {
            return Vec::new();
        };
        let question = match prompt {
            Some(p) => {
                let ctx =
                    render::context(&self.state, &self.run_id, &level.id, &self.runtime.catalog);
                match self.renderer.render(p, &ctx) {
                    Ok(q) => q,
                    Err(e) => {
                        return vec![self.event(EventData::LevelFinished(Box::new(
                            LevelFinished::failed(e, 0),
                        )))];
                    }
                }
            }
            None => format!(
                "Approve the result of `{}`?",
                self.state.in_flight.clone().unwrap_or_default()
            ),
        };
        // The level's timeout bounds the wait for a decision.
        let deadline = level
            .timeout_s
            .and_then(|s| chrono::Duration::from_std(Duration::from_secs_f64(s)).ok())
            .map(|limit| self.clock.now() + limit);
        vec![self.event(EventData::ApprovalRequested(ApprovalRequested {
            request_id: format!("{}#{}", level.id, self.attempt),
            approver_role: approver_role.clone(),
            question,
            schema: output_schema.value().clone(),
            deadline,
            tool: None,
        }))]
    }
}
