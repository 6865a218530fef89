/**
 * The web dashboard and the Prometheus endpoint: `createDashboard()` (what
 * `pgasynq dash` runs) and `metricsHandler()` for your own HTTP server.
 */
export {
  createDashboard,
  DASHBOARD_HOST_DEFAULT,
  DASHBOARD_PORT_DEFAULT,
  DASHBOARD_REFRESH_DEFAULT_MS,
  type Dashboard,
  type DashboardOptions,
} from './server.js';
export {
  metricsHandler,
  serverMetrics,
  collectMetrics,
  renderPrometheus,
  PROMETHEUS_CONTENT_TYPE,
  type MetricFamily,
  type MetricSample,
  type MetricsHandler,
  type MetricsHandlerOptions,
} from './metrics.js';
