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
        items: [guide('Getting started', 'getting-started'), guide('Concepts', 'concepts'), guide('Examples', 'examples')],
      },
      {
        text: 'Coming from',
        items: [
          guide('asynq', 'coming-from-asynq'),
          guide('BullMQ', 'coming-from-bullmq'),
          guide('graphile-worker', 'coming-from-graphile-worker'),
          guide('pg-boss', 'coming-from-pg-boss'),
        ],
      },
      {
        text: 'Guides',
        items: [
          guide('Transactional enqueue', 'transactional-enqueue'),
          guide('Exactly-once effects', 'exactly-once'),
          guide('Retries and errors', 'retries'),
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
          guide('Running in production', 'production'),
          guide('Roles and pgbouncer', 'deployment'),
          guide('Upgrading', 'upgrading'),
          guide('Limits and safety', 'limits'),
        ],
      },
      {
        text: 'Reference',
        items: [
          { text: 'CLI', link: '/reference/cli' },
          { text: 'Configuration defaults', link: '/reference/configuration' },
          { text: 'Error codes', link: '/reference/errors' },
          { text: 'SQL views and functions', link: '/reference/sql' },
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
