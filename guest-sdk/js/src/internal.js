// What the build's generated entry imports. Not part of the API.
export { componentExports } from './tool.js';
