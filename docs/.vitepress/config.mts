import { defineConfig } from 'vitepress';
import api from '../reference/api/typedoc-sidebar.json';

const guide = (text: string, link: string) => ({ text, link: `/guide/${link}` });

export default defineConfig({
  title: 'pgasynq',
  description: "asynq's task-queue model in TypeScript, on PostgreSQL alone",
  cleanUrls: true,
  // A broken link fails the build (VitePress's default); the repository's own files are linked on GitHub.
  srcExclude: ['scripts/**', 'README.md'],
  themeConfig: {
    nav: [
      { text: 'Guide', link: '/guide/getting-started' },
      { text: 'Reference', link: '/reference/api/' },
      { text: 'Performance', link: '/performance' },
      { text: 'Changelog', link: '/changelog' },
    ],
    sidebar: [
      {
        text: 'Introduction',
        items: [guide('Getting started', 'getting-started'), guide('Concepts', 'concepts'), guide('Coming from asynq', 'coming-from-asynq')],
      },
      {
        text: 'Guides',
        items: [
          guide('Transactional enqueue', 'transactional-enqueue'),
          guide('Server options', 'options'),
          guide('Scheduling and cron', 'scheduling'),
          guide('Groups', 'groups'),
          guide('Workflows', 'workflows'),
          guide('Priority and limits', 'flow-control'),
          guide('Following and awaiting tasks', 'following'),
          guide('Tracing', 'tracing'),
          guide('Logging', 'logging'),
          guide('Testing your handlers', 'testing'),
        ],
      },
      {
        text: 'Operating',
        items: [
          guide('Inspecting queues', 'inspecting'),
          guide('The pgasynq command', 'cli'),
          guide('Dashboard and metrics', 'dashboard'),
          guide('Task state in SQL', 'sql'),
          guide('Deployment', 'deployment'),
          guide('Upgrading', 'upgrading'),
          guide('Limits and safety', 'limits'),
        ],
      },
      {
        text: 'Reference',
        items: [
          { text: 'CLI', link: '/reference/cli' },
          { text: 'API', items: api },
        ],
      },
      {
        text: 'Project',
        items: [
          { text: 'Performance', link: '/performance' },
          { text: 'Changelog', link: '/changelog' },
        ],
      },
    ],
    search: { provider: 'local' },
    socialLinks: [{ icon: 'github', link: 'https://github.com/pgasynq/pgasynq' }],
  },
});
