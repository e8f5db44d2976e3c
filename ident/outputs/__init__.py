"""What identification hands the user: result.json and the model files (`results`), reports (`report`,
`report_html`), provenance, the comparison with a reference model (`reference`), and many recordings at once
(`fleet`, `fleet_report`)."""
