"""Chat alert hooks: recommendations grouped per site and posted to Slack, Mattermost, Microsoft Teams or a
generic JSON webhook, deduplicated across restarts, rate limited and retried per receiver."""
