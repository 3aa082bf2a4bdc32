"""Safety before and after the model: detectors, the policy, and the filter on streamed output."""
